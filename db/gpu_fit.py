"""Create-time GPU fit (issue #50): a model that cannot fit its instance type's GPUs, or a
container option that cannot be read, is refused by CreateEndpoint, UpdateEndpoint and
CreateOptimizationJob before any row is written or any weight copied to a host.

Contract:
- `check_endpoint_config(session, account, config_spec, store)`: for each of the config's
  ProductionVariants, its model (the caller's account's), that model's container
  (PrimaryContainer, else Containers[0]) and its Environment read by
  foundation/server_options.read: a bad option is a ValidationException
  "Variant '<name>': <message naming the variable>", whatever the instance type (a
  serverless or CPU variant gets this check only). On a GPU InstanceType (accelerators > 0)
  the model is then planned as the worker will plan it (foundation/memory_plan.plan: one
  server on all the type's GPUs; OPTION_TENSOR_PARALLEL_DEGREE=max: all of them) and a
  PlanError becomes "Variant '<name>': <message naming the sizes>". The head:
  none without an ``eagle_model`` channel; the channel's config.json and *.safetensors
  when readable; else `head_estimate` with the default draft vocabulary.
- `check_job(session, account, spec, store)`: the same for CreateOptimizationJob: the
  target is ModelSource.S3.S3Uri, else the SageMakerModel's container's model data; the
  options come from OptimizationEnvironment ("OptimizationEnvironment: <message>"); the
  head is estimated (EAGLENEST_NUM_LAYERS, default 1; EAGLENEST_DRAFT_VOCAB_SIZE, default
  the worker's); one server (the benchmark's) on all the DeploymentInstanceType's GPUs;
  refusals read "DeploymentInstanceType <type>: <message>".
- A model is planned only from an uncompressed S3 prefix (ModelDataSource with
  CompressionType None and S3DataType S3Prefix, or a ModelDataUrl / S3Uri that is neither
  a .tar.gz nor a single object) whose config.json exists, in a bucket the caller may read
  as the worker's view does (foundation/store/buckets.AccountStore: the caller's own, or one no
  account owns when the caller is the store's default account). Another account's bucket
  is never read. Anything else (no store, a tarball, a missing bucket or config.json, a
  store failure) plans nothing, nor does a folder the plan cannot size (memory_plan's
  ShapeError: a config.json that is not JSON or lacks the layers, heads or vocabulary, no
  safetensors weights): Create refuses only what it knows cannot fit, and the worker
  checks the rest when it deploys, naming what is missing.
- Reads only config.json, model.safetensors.index.json (and the head's config.json) and
  the prefix's listing: no weights. Writes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.db.repository import find
from eaglenest.db.tables import ModelRow
from eaglenest.foundation import instance_types, server_options
from eaglenest.foundation.accounts import Account
from eaglenest.foundation.errors import ValidationException
from eaglenest.foundation.instance_types import InstanceType
from eaglenest.foundation.memory_plan import (
    DEFAULT_DRAFT_VOCAB,
    HeadShape,
    ModelShape,
    PlanError,
    ShapeError,
    gpus_of_type,
    head_estimate,
    head_from,
    read_shape,
)
from eaglenest.foundation.store.storage import BucketStore, ObjectInfo, S3Uri, parse_uri

log = logging.getLogger("eaglenest.gpu_fit")

#: the AdditionalModelDataSources channel of a draft head (workers/infra/model_fetch.py)
EAGLE_CHANNEL = "eagle_model"
_TARBALLS = (".tar.gz", ".tgz")
_CONFIG, _INDEX = "config.json", "model.safetensors.index.json"


@dataclass(frozen=True)
class Source:
    """Where a model (or head) lies: its S3 URI, and whether it is a prefix of files
    (False: a tarball or a single object, which Create does not open)."""

    uri: str
    folder: bool = True


def check_endpoint_config(session: Session, account: Account, config_spec: dict[str, Any],
                          store: BucketStore | None) -> None:
    """Every ProductionVariant's options, and its fit on a GPU type (module contract)."""
    for variant in config_spec.get("ProductionVariants") or []:
        _check_variant(session, account, variant, store)


def _check_variant(session: Session, account: Account, variant: dict[str, Any],
                   store: BucketStore | None) -> None:
    where = f"Variant '{variant['VariantName']}'"
    row = find(session, ModelRow, variant.get("ModelName") or "",
               account_id=account.account_id)
    if row is None:
        return  # deleted since the config was created: the worker reports it
    container = _container(row.spec)
    options = _options(container.get("Environment") or {}, where)
    itype = _gpu_type(variant.get("InstanceType"))
    model = _container_source(container)
    if itype is None or store is None or model is None:
        return
    shape = _shape(store, account, model, where)
    if shape is None:
        return
    head_source = _head_source(container)
    head = _head(store, account, head_source, shape) if head_source else None
    _plan(where, shape, itype, options, head)


def check_job(session: Session, account: Account, spec: dict[str, Any],
              store: BucketStore | None) -> None:
    """CreateOptimizationJob's options and the fit of its benchmark server (module
    contract)."""
    env = spec.get("OptimizationEnvironment") or {}
    options = _options(env, "OptimizationEnvironment")
    name = spec["DeploymentInstanceType"]
    itype = _gpu_type(name)
    model = _job_source(session, account, spec["ModelSource"])
    if itype is None or store is None or model is None:
        return
    where = f"DeploymentInstanceType {name}"
    shape = _shape(store, account, model, where)
    if shape is None:
        return
    # a DFlash head stacks EAGLENEST_DFLASH_LAYERS layers (the other kinds NUM_LAYERS)
    layers = max(_env_int(env, "EAGLENEST_NUM_LAYERS", 1),
                 _env_int(env, "EAGLENEST_DFLASH_LAYERS", 1))
    head = head_estimate(shape, layers,
                         _env_int(env, "EAGLENEST_DRAFT_VOCAB_SIZE", DEFAULT_DRAFT_VOCAB))
    _plan(where, shape, itype, options, head)


def _options(env: Mapping[str, str], where: str) -> server_options.ServerOptions:
    try:
        return server_options.read(env)
    except server_options.OptionError as exc:
        raise ValidationException(f"{where}: {exc}") from None


def _gpu_type(name: str | None) -> InstanceType | None:
    """The instance type `name` when it has GPUs; None for a CPU or unknown type (the
    config's own check refuses those) or a serverless variant (no type)."""
    if not name:
        return None
    try:
        itype = instance_types.lookup(name)
    except instance_types.UnsupportedInstanceType:
        return None
    return itype if itype.accelerators > 0 else None


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """A positive integer option, else `default` (a bad value is the worker's to refuse)."""
    raw = str(env.get(name) or "").strip()
    return int(raw) if raw.isascii() and raw.isdigit() and int(raw) > 0 else default


def _container(model_spec: dict[str, Any]) -> dict[str, Any]:
    """The container a model serves from: PrimaryContainer, else the first of Containers."""
    found = model_spec.get("PrimaryContainer") or (model_spec.get("Containers") or [{}])[0]
    return found or {}


def _data_source(source: dict[str, Any] | None) -> Source | None:
    """An S3DataSource's URI: a folder only when uncompressed and an S3Prefix."""
    s3 = (source or {}).get("S3DataSource") or {}
    if not s3.get("S3Uri"):
        return None
    folder = (s3.get("CompressionType") or "None") == "None" and \
        (s3.get("S3DataType") or "S3Prefix") == "S3Prefix"
    return Source(s3["S3Uri"], folder)


def _url_source(uri: str | None) -> Source | None:
    """A ModelDataUrl / ModelSource.S3.S3Uri: a folder unless a tarball."""
    return Source(uri, not uri.endswith(_TARBALLS)) if uri else None


def _container_source(container: dict[str, Any]) -> Source | None:
    """The model data of a container: ModelDataSource, else ModelDataUrl."""
    return _data_source(container.get("ModelDataSource")) or \
        _url_source(container.get("ModelDataUrl"))


def _head_source(container: dict[str, Any]) -> Source | None:
    found = None
    for extra in container.get("AdditionalModelDataSources") or []:
        if extra.get("ChannelName") == EAGLE_CHANNEL:
            found = _data_source(extra) or Source("", False)
    return found


def _job_source(session: Session, account: Account, source: dict[str, Any]
                ) -> Source | None:
    """ModelSource.S3.S3Uri when S3 is given, else the SageMakerModel's container's data
    (workers/jobs/inputs.resolve_sources' precedence)."""
    if source.get("S3"):
        return _url_source(source["S3"].get("S3Uri"))
    name = (source.get("SageMakerModel") or {}).get("ModelName")
    row = find(session, ModelRow, name, account_id=account.account_id) if name else None
    return _container_source(_container(row.spec)) if row is not None else None


def _listing(store: BucketStore, account: Account, source: Source
             ) -> tuple[S3Uri, dict[str, ObjectInfo]] | None:
    """(the folder, its objects by name: directly in it, not below) when `source` is an
    uncompressed prefix in a bucket the caller may read (module contract); else None."""
    if not source.folder:
        return None
    try:
        uri = parse_uri(source.uri)
        owner = store.owner(uri.bucket)
        if owner != account.account_id and not (
                owner is None and account.account_id == store.default_account):
            return None  # another account's bucket is never read
        if uri.key and not uri.key.endswith("/") and store.stat(uri) is not None:
            return None  # a single object: the worker downloads (and unpacks) it
        folder = parse_uri(f"s3://{uri.bucket}/{uri.key}/") if uri.key and \
            not uri.key.endswith("/") else uri
        objects = store.list_objects(folder)
    except Exception as exc:  # a missing bucket, a store failure: the worker's to report
        log.info("no Create-time GPU plan for %s: %s", source.uri, exc)
        return None
    inside = {o.key[len(folder.key):]: o for o in objects if o.key.startswith(folder.key)}
    return folder, {n: o for n, o in inside.items() if "/" not in n}


class _Unreadable(Exception):
    """A file the listing showed that the store then failed to give: plan nothing."""


def _json(store: BucketStore, uri: S3Uri) -> dict[str, Any]:
    """A small JSON file of the folder; ShapeError when it is not a JSON object (the
    worker's words), _Unreadable when the store fails."""
    try:
        data = store.get_bytes(uri)
    except Exception as exc:
        raise _Unreadable(f"{uri}: {exc}") from None
    name = uri.key.rsplit("/", 1)[-1]
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ShapeError(f"{name} cannot be read: {exc}") from None
    if not isinstance(doc, dict):
        raise ShapeError(f"{name} cannot be read: it is not a JSON object")
    return doc


def _safetensors_bytes(files: dict[str, ObjectInfo]) -> int:
    return sum(o.size for n, o in files.items() if n.endswith(".safetensors"))


def _shape(store: BucketStore, account: Account, source: Source, where: str
           ) -> ModelShape | None:
    """The target's shape from its folder's config.json and index (else the bytes of its
    *.safetensors), as memory_plan.shape_of reads a folder on disk; None when there is no
    folder to read or the plan cannot size it (module contract)."""
    listed = _listing(store, account, source)
    if listed is None or _CONFIG not in listed[1]:
        return None  # no config.json: the worker fails with its missing-files message
    folder, files = listed
    try:
        config = _json(store, folder.child(_CONFIG))
        index = _json(store, folder.child(_INDEX)) if _INDEX in files else None
        return read_shape(config, index, _safetensors_bytes(files))
    except (_Unreadable, ShapeError) as exc:
        log.info("%s: no Create-time GPU plan of %s: %s", where, source.uri, exc)
        return None


def _head(store: BucketStore, account: Account, source: Source,
          shape: ModelShape) -> HeadShape:
    """The head's parameters and layers from its config.json and *.safetensors (as
    memory_plan.head_of reads a folder), else an estimate of an EagleNest head."""
    listed = _listing(store, account, source)
    size = _safetensors_bytes(listed[1]) if listed else 0
    if listed is None or _CONFIG not in listed[1] or size <= 0:
        return head_estimate(shape, draft_vocab=DEFAULT_DRAFT_VOCAB)
    try:
        config = _json(store, listed[0].child(_CONFIG))
    except (ShapeError, _Unreadable):
        return head_estimate(shape, draft_vocab=DEFAULT_DRAFT_VOCAB)
    return head_from(config, size)


def _plan(where: str, shape: ModelShape, itype: InstanceType,
          options: server_options.ServerOptions, head: HeadShape | None) -> None:
    """One server on all of `itype`'s GPUs, as the worker plans it
    (foundation/server_options.plan_for); ValidationException when it cannot hold."""
    try:
        server_options.plan_for(options, shape, gpus_of_type(itype), head)
    except PlanError as exc:
        raise ValidationException(f"{where}: {exc}") from None
