"""Turning an endpoint config into running serving processes: per production variant,
InitialInstanceCount processes (one port each) over one fetched copy of the model.

Per-variant options come from the model container's `Environment` (documented in README):
EAGLENEST_SERVING_BACKEND (vllm | embedded; default vllm when installed),
EAGLENEST_NUM_SPECULATIVE_TOKENS (default: the K the head was trained/benchmarked with, else
5), EAGLENEST_SPECULATION_SCHEDULE (K, and on the embedded backend the decoding, per load;
default: the channel's speculation_schedule.json unless EAGLENEST_NUM_SPECULATIVE_TOKENS is
set; ``none``: a fixed K),
EAGLENEST_EXPECTED_CONCURRENCY (vLLM without dynamic speculation: the load whose K is used,
default 1), EAGLENEST_SPLIT_SERVING (vLLM: 1, the default = where the schedule is off above
some load, a second server of the target alone serves those loads; 0 = one server),
EAGLENEST_DECODE_MODE (embedded: chain | tree | parallel | block), EAGLENEST_ADAPTIVE (embedded:
1 = K / tree depth chosen online), EAGLENEST_MAX_MODEL_LEN, EAGLENEST_DTYPE. The head comes
from the container's `eagle_model` channel.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from eaglenest.db.repository import find
from eaglenest.db.tables import EndpointConfigRow, ModelRow
from eaglenest.foundation import environment, server_options
from eaglenest.foundation.deployment import instances_of
from eaglenest.foundation.dtypes import AUTO, FLOAT32
from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.host.threads import SHARING_ENV, ComputeBudgetExceeded, ComputeLedger
from eaglenest.foundation.http import instance_auth
from eaglenest.foundation.instance_types import InstanceType, UnsupportedInstanceType, lookup
from eaglenest.foundation.memory_plan import CPU_MAX_MODEL_LEN, gpus_of_type
from eaglenest.foundation.shapes import AwsShape, StoredShapeError, rebuild
from eaglenest.foundation.shapes.endpoint_configs import CreateEndpointConfigInput
from eaglenest.foundation.shapes.models import CreateModelInput
from eaglenest.foundation.store.storage import ArtifactStore
from eaglenest.models.decode.modes import SPECULATIVE_MODES
from eaglenest.workers.infra.model_fetch import (
    InputError,
    container_uris,
    fetch_tree,
    model_container,
)
from eaglenest.workers.infra.placement import Placer
from eaglenest.workers.model_servers import gpu_options
from eaglenest.workers.model_servers.process import (
    VLLM,
    ServerProcess,
    ServerSpec,
    cuda_available,
    default_backend,
    vllm_dynamic_speculation,
)
from eaglenest.workers.model_servers.schedule import (
    SCHEDULE_ENV,
    Schedule,
    ScheduleError,
    parse_schedule,
    read_schedule,
)
from eaglenest.workers.serving.records import resolved_image, stop_servers

DEFAULT_HEALTH_TIMEOUT = 900
log = logging.getLogger("eaglenest.endpoints")
Shape = TypeVar("Shape", bound=AwsShape)


class DeployError(Exception):
    """Why an endpoint could not be deployed; becomes its FailureReason."""


@dataclass
class VariantPlan:
    variant: str
    model_name: str
    weight: float
    instance_count: int
    health_timeout: int
    model_uri: str
    head_uri: str | None
    env: dict[str, str] = field(default_factory=dict)
    #: the account of the endpoint config: the model is fetched through its view of the store
    account_id: str = ""
    #: the variant's InstanceType ("" for a serverless variant: the CPU)
    instance_type: str = ""
    #: `python -m` module of a vLLM server (Settings.vllm_module)
    vllm_module: str = "vllm.entrypoints.openai.api_server"
    #: the host's budget of compute processes (foundation/host/threads.py; 0: not checked)
    compute_budget: int = 0
    #: the host's linear-kernel timing cache for embedded servers (None: each measures)
    kernel_cache: Path | None = None
    #: the model container's Image as specified ("" when it has none)
    image: str = ""


@dataclass
class Placement:
    """Where a variant's instances run: the worker's placer and the endpoint holding them
    (None: no placement, e.g. a benchmark)."""

    placer: Placer
    holder: str


def plan_variants(session: Session, account_id: str, config_name: str) -> list[VariantPlan]:
    """The variants of `account_id`'s endpoint config `config_name` (the endpoint's account:
    another account's config or model of the same name is never used)."""
    config = find(session, EndpointConfigRow, config_name, account_id=account_id)
    if config is None:
        raise DeployError(f"Endpoint configuration {config_name} no longer exists.")
    plans = []
    for v in _rebuild(CreateEndpointConfigInput, config.spec).ProductionVariants:
        name = str(v.ModelName)  # endpoint_configs_repo refuses a variant without one
        row = find(session, ModelRow, name, account_id=account_id)
        if row is None:
            raise DeployError(f"Model {name} of variant {v.VariantName} no longer exists.")
        container = model_container(_rebuild(CreateModelInput, row.spec))
        model_uri, head_uri = container_uris(container)
        if not model_uri:
            raise DeployError(f"Model {name} has no ModelDataSource or ModelDataUrl.")
        timeout = v.ContainerStartupHealthCheckTimeoutInSeconds
        ignored = environment.ignored_warning(container.Environment, "Environment",
                                              f"model {name}")
        if ignored:
            log.warning("variant %s of endpoint config %s %s", v.VariantName, config_name,
                        ignored)
        plans.append(VariantPlan(
            variant=v.VariantName, model_name=name,
            weight=float(1.0 if v.InitialVariantWeight is None else v.InitialVariantWeight),
            instance_count=int(1 if v.InitialInstanceCount is None else v.InitialInstanceCount),
            health_timeout=int(DEFAULT_HEALTH_TIMEOUT if timeout is None else timeout),
            model_uri=model_uri, head_uri=head_uri,
            env=dict(container.Environment or {}), account_id=config.account_id,
            instance_type=str(v.InstanceType or ""), image=str(container.Image or ""),
        ))
    return plans


def _rebuild(shape: type[Shape], stored: dict[str, Any]) -> Shape:
    try:
        return rebuild(shape, stored)
    except StoredShapeError as exc:
        raise DeployError(str(exc)) from None


def _speculative_tokens(asked: int | None, head_dir: Path | None) -> int:
    """EAGLENEST_NUM_SPECULATIVE_TOKENS, else the head's training K, else 5."""
    if asked is not None:
        return asked
    prov = head_dir / "provenance.json" if head_dir else None
    if prov and prov.exists():
        cfg = json.loads(prov.read_text()).get("train_config", {})
        return int(cfg.get("speculative_tokens", 5))
    return 5


def _spec(plan: VariantPlan, model_dir: Path, head_dir: Path | None, served: str) -> ServerSpec:
    """The server of `plan`: its container's options read by CreateModel's own check
    (foundation/server_options.py check_container), then what only this host knows."""
    try:
        opts = server_options.check_container(plan.env, SPECULATIVE_MODES, default_backend())
    except server_options.OptionError as exc:
        raise DeployError(str(exc)) from None
    if opts.backend == VLLM and default_backend() != VLLM:
        raise DeployError("EAGLENEST_SERVING_BACKEND=vllm but vLLM is not installed on the "
                          "worker (pip install 'EagleNest[vllm]')")
    try:
        environment.check(plan.env, f"model {plan.model_name}'s Environment")
    except environment.EnvironmentRejected as exc:
        raise DeployError(f"Variant {plan.variant}: {exc}") from exc
    wants = opts.server.wants
    spec = ServerSpec(model_dir=model_dir, served_name=served, port=free_port(),
                      backend=str(opts.backend), head_dir=head_dir, adaptive=opts.adaptive,
                      num_speculative_tokens=_speculative_tokens(opts.speculative_tokens,
                                                                 head_dir),
                      mode=opts.mode, dtype=FLOAT32 if wants.dtype == AUTO else wants.dtype,
                      max_model_len=wants.max_model_len or CPU_MAX_MODEL_LEN,
                      max_num_seqs=wants.max_num_seqs,
                      max_input_length=opts.server.max_input_length,
                      secret=instance_auth.new_secret(),
                      schedule=_schedule(plan, head_dir) if head_dir else None,
                      expected_load=opts.expected_concurrency, split=opts.split,
                      extra_env=dict(plan.env))  # as SageMaker sets a container's Environment
    refused = spec.schedule_refusal()
    if refused is not None:
        raise DeployError(f"Variant {plan.variant}: {refused}")
    if spec.backend == VLLM and spec.schedule is not None and spec.schedule.decodings:
        log.info("variant %s: vLLM drafts with the head's own method at the schedule's K; "
                 "the decodings it names (%s) are the embedded engine's", plan.variant,
                 ", ".join(spec.schedule.decodings))
    return spec


def _schedule(plan: VariantPlan, head_dir: Path) -> Schedule | None:
    """EAGLENEST_SPECULATION_SCHEDULE (``none``: a fixed K), else a fixed K when
    EAGLENEST_NUM_SPECULATIVE_TOKENS is set, else the channel's speculation_schedule.json."""
    raw = plan.env.get(SCHEDULE_ENV)
    try:
        if raw is not None:
            return None if raw.strip().lower() == "none" else parse_schedule(raw)
        if plan.env.get("EAGLENEST_NUM_SPECULATIVE_TOKENS"):
            return None
        return read_schedule(head_dir)
    except ScheduleError as exc:
        raise DeployError(str(exc)) from exc


def start_variant(store: ArtifactStore, workdir: Path, endpoint: str, plan: VariantPlan,
                  advertise_host: str = "127.0.0.1", children_dir: Path | None = None,
                  resource: str | None = None,
                  placement: Placement | None = None) -> dict[str, Any]:
    """Fetch the model (and head), start `plan.instance_count` servers side by side, wait
    for each /health. Returns the variant's record stored in the endpoint's deployment:
    `instances` lists every process (url, pid, and `child`: its ChildRecord, what stopping
    it checks); `url`/`pid` repeat the first one. `endpoint` is the model name the servers
    answer to; `resource` labels their process records (default `endpoint:<endpoint>`)."""
    resource = resource or f"endpoint:{endpoint}"
    gen = uuid.uuid4().hex[:8]
    base = workdir / f"{plan.variant}-{gen}"
    try:
        model_dir = fetch_tree(store, plan.model_uri, base / "model")
        head_dir = fetch_tree(store, plan.head_uri, base / "head") if plan.head_uri else None
    except InputError as exc:
        raise DeployError(f"Variant {plan.variant}: {exc}") from exc
    _check_model(model_dir, plan.variant)
    specs, started = _start_instances(plan, base, model_dir, head_dir, endpoint,
                                      advertise_host, list(range(plan.instance_count)),
                                      children_dir, resource, placement)
    return {**started[0], "served_name": endpoint, "resource": resource,
            "instance_type": plan.instance_type,
            "backend": specs[0].backend, "image": plan.image,
            "resolved_image": resolved_image(specs[0].backend), "resolved_at": time.time(),
            "weight": plan.weight, "dir": str(base), "speculative": head_dir is not None,
            "k": specs[0].num_speculative_tokens, "instances": started,
            "schedule": specs[0].schedule.to_list() if specs[0].schedule else None,
            "served_k": served_k(specs[0])}


def served_k(spec: ServerSpec) -> int | list[list[int]]:
    """The K the variant's servers run (workers/serving/endpoint_metrics.py k_in_force): a
    fixed K (0: the target alone), or K per load, a schedule's thresholds, where the server
    follows the load (the embedded engine; vLLM with dynamic speculation)."""
    if not spec.speculates():
        return 0
    schedule = spec.served_schedule()
    if spec.backend == VLLM and not (schedule is not None and vllm_dynamic_speculation()):
        config = spec.vllm_speculative_config()
        return int(config["num_speculative_tokens"]) if config else 0
    if schedule is None:
        return spec.speculative_tokens()
    return [[m, k] for m, k, _ in schedule.thresholds]  # K only: decodings are not a K


def _start_instances(plan: VariantPlan, base: Path, model_dir: Path, head_dir: Path | None,
                     endpoint: str, advertise_host: str, indexes: list[int],
                     children_dir: Path | None, resource: str, placement: Placement | None = None,
                     units: list[str] | None = None
                     ) -> tuple[list[ServerSpec], list[dict[str, Any]]]:
    """Place each instance (its GPUs), launch one server per index (log `server-<i>.log`),
    then wait for all of them under one deadline; if any fails, stop every one of them,
    free their GPUs and raise (NoCapacity when the host cannot place them). `units`: the
    instances' placement units (default `<base>-<index>`; a restart keeps the old ones)."""
    units = units or [f"{base.name}-{i}" for i in indexes]
    try:
        specs = _specs(plan, model_dir, head_dir, endpoint, advertise_host, units, placement)
        servers = [ServerProcess(spec, base / f"server-{i}.log", children_dir, resource,
                                 "serving-instance")
                   for i, spec in zip(indexes, specs, strict=True)]
        deadline = time.monotonic() + plan.health_timeout
        try:
            for server in servers:
                server.launch()
            for server in servers:
                server.wait_healthy(deadline)
        except BaseException:
            for server in servers:
                server.stop()
            raise
    except BaseException:
        if placement is not None:
            placement.placer.release(placement.holder, units)
        raise
    host = placement.placer.host if placement else None
    return specs, [{"url": f"http://{advertise_host}:{srv.spec.port}",
                    "pid": srv.proc.pid if srv.proc else 0, "secret": srv.spec.secret,
                    "child": srv.record.to_dict() if srv.record else None,
                    "unit": unit, "host": host, "gpus": gpus, "dir": str(base),
                    # ModelSetupTime (workers/serving/endpoint_metrics.py): spawn -> /health
                    "ready_at": srv.ready_at, "setup_seconds": srv.setup_seconds}
                   for srv, unit, gpus in zip(servers, units, [s.gpus for s in specs],
                                              strict=True)]


def _specs(plan: VariantPlan, model_dir: Path, head_dir: Path | None, endpoint: str,
           advertise_host: str, units: list[str], placement: Placement | None
           ) -> list[ServerSpec]:
    """One server spec per unit, each with the GPUs placed for it (taken here)."""
    specs: list[ServerSpec] = []
    try:  # these start together: one share each, all within the host's budget
        sharing = ComputeLedger().admit(len(units), plan.compute_budget) + len(units)
    except ComputeBudgetExceeded as exc:
        raise DeployError(f"Variant {plan.variant}: {exc}") from exc
    itype = _instance_type(plan) if placement else None
    for unit in units:
        spec = _spec(plan, model_dir, head_dir, served=endpoint)
        spec.extra_env.setdefault(SHARING_ENV, str(sharing))
        spec.vllm_module, spec.kernel_cache = plan.vllm_module, plan.kernel_cache
        while spec.port in {s.port for s in specs}:  # free_port() may hand out one twice
            spec.port = free_port()
        if advertise_host != "127.0.0.1":
            spec.bind_host = "0.0.0.0"
        if placement is not None and itype is not None:
            gpus = placement.placer.take(placement.holder, unit, itype, backend=spec.backend)
            try:
                gpu_options.apply(spec, plan.env, gpus, placement.placer.visible(gpus),
                                  gpus_of_type(itype), cuda_available())
            except gpu_options.GpuOptionError as exc:
                raise DeployError(f"Variant {plan.variant}: {exc}") from exc
        specs.append(spec)
    return specs


def _instance_type(plan: VariantPlan) -> InstanceType:
    if not plan.instance_type:  # serverless: runs on the CPU
        return InstanceType("serverless", 0, 0.0, "")
    try:
        return lookup(plan.instance_type)
    except UnsupportedInstanceType as exc:
        raise DeployError(f"Variant {plan.variant}: {exc}") from exc


def restart_instances(plan: VariantPlan, record: dict[str, Any], dead: list[int],
                      advertise_host: str = "127.0.0.1",
                      children_dir: Path | None = None,
                      placement: Placement | None = None) -> dict[str, Any]:
    """Replace the instances at `dead` of a running variant (same model files, new ports),
    keeping the others. Returns the updated record; the new instances are the ones at
    `dead` in its `instances` (all of this host: their model files are the first's `dir`)."""
    old = instances_of(record)
    base = Path((old[dead[0]].get("dir") if dead else None) or record["dir"])
    head_dir = base / "head" if record.get("speculative") else None
    if not (base / "model").is_dir() or (head_dir is not None and not head_dir.is_dir()):
        raise DeployError(f"Variant {plan.variant}: its model files are gone from {base}.")
    stop_servers({str(i): old[i] for i in dead}, children_dir)  # one that hangs must not linger
    units = [str(old[i]["unit"]) for i in dead if old[i].get("unit")]
    _, started = _start_instances(plan, base, base / "model", head_dir, record["served_name"],
                                  advertise_host, dead, children_dir, _resource(record), placement,
                                  units if len(units) == len(dead) else None)
    new = list(old)
    for i, inst in zip(dead, started, strict=True):
        new[i] = inst
    return {**record, **new[0], "instances": new}


def add_instances(plan: VariantPlan, record: dict[str, Any], count: int,
                  advertise_host: str = "127.0.0.1", children_dir: Path | None = None,
                  placement: Placement | None = None) -> tuple[dict[str, Any], list[Any]]:
    """Grow a running variant to `count` instances over its fetched model files. Returns
    the updated record and the new instances alone."""
    base = Path(record["dir"])
    head_dir = base / "head" if record.get("speculative") else None
    if not (base / "model").is_dir() or (head_dir is not None and not head_dir.is_dir()):
        raise DeployError(f"Variant {plan.variant}: its model files are gone from {base}.")
    old = instances_of(record)
    _, started = _start_instances(plan, base, base / "model", head_dir, record["served_name"],
                                  advertise_host, list(range(len(old), count)), children_dir,
                                  _resource(record), placement)
    return {**record, "instances": old + started}, started


def _resource(record: dict[str, Any]) -> str:
    return str(record.get("resource") or f"endpoint:{record['served_name']}")


def _check_model(model_dir: Path, variant: str) -> None:
    try:
        from eaglenest.models.target import TargetError, check_model_files
    except ImportError:
        return  # a serving-only worker without the train extra: the server will tell
    try:
        check_model_files(model_dir)
    except TargetError as exc:
        raise DeployError(f"Variant {variant}: {exc}") from exc
