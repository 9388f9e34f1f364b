"""Where a job's model, data and optional starting head come from, and fetching them.

- model: `ModelSource.S3.S3Uri`, or the `ModelDataSource` / `ModelDataUrl` of the
  container of `ModelSource.SageMakerModel` (an S3 prefix, a single object or a .tar.gz);
- starting head ("bring your own EAGLE"): that container's AdditionalModelDataSources
  entry with ChannelName `eagle_model`;
- data: `TrainingDataSource` (S3Prefix or ManifestFile), else built-in datasets
  (`EAGLENEST_DATASET`, default: all of them).
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from eaglenest.foundation.shapes import AwsShape
from eaglenest.foundation.shapes.models import ContainerDefinition, CreateModelInput
from eaglenest.foundation.shapes.optimization_jobs import CreateOptimizationJobRequest
from eaglenest.foundation.store.storage import (
    ArtifactStore,
    StorageError,
    download_prefix,
    read_manifest,
)

EAGLE_CHANNEL = "eagle_model"


class InputError(Exception):
    """A job input that cannot be used; the message is the job's FailureReason."""


@dataclass(frozen=True)
class JobSources:
    model_uri: str
    head_uri: str | None
    data_uri: str | None
    data_type: str  # S3Prefix | ManifestFile | builtin


def _given(shape: AwsShape | None) -> bool:
    """A member the request set with at least one member of its own (``{}`` is absent)."""
    return shape is not None and bool(shape.model_fields_set)


def model_container(model: CreateModelInput) -> ContainerDefinition:
    """The container a model serves from: PrimaryContainer, else the first of Containers."""
    if model.PrimaryContainer is not None and _given(model.PrimaryContainer):
        return model.PrimaryContainer
    return (model.Containers or [ContainerDefinition()])[0]


def container_uris(container: ContainerDefinition) -> tuple[str | None, str | None]:
    """(model artifacts URI, head URI of the ``eagle_model`` channel) of a container."""
    src = container.ModelDataSource.S3DataSource if container.ModelDataSource else None
    model_uri = (src.S3Uri if src else None) or container.ModelDataUrl
    head_uri = None
    for extra in container.AdditionalModelDataSources or []:
        if extra.ChannelName == EAGLE_CHANNEL:
            head_uri = extra.S3DataSource.S3Uri
    return model_uri, head_uri


def resolve_sources(job: CreateOptimizationJobRequest,
                    model: CreateModelInput | None) -> JobSources:
    source = job.ModelSource
    head_uri = None
    if source.S3 is not None and _given(source.S3):
        if not source.S3.S3Uri:
            raise InputError("ModelSource.S3 has no S3Uri")
        model_uri = source.S3.S3Uri
    else:
        if model is None:
            name = source.SageMakerModel.ModelName if source.SageMakerModel else None
            raise InputError(f"ModelSource.SageMakerModel: model {name} no longer exists")
        found, head_uri = container_uris(model_container(model))
        if not found:
            raise InputError("ModelSource.SageMakerModel: the model's container has neither "
                             "ModelDataSource.S3DataSource.S3Uri nor ModelDataUrl")
        model_uri = found
    cfg = job.OptimizationConfigs[0].ModelSpeculativeDecodingConfig
    data = cfg.TrainingDataSource if cfg else None
    if data:
        return JobSources(model_uri, head_uri, data.S3Uri, data.S3DataType or "S3Prefix")
    return JobSources(model_uri, head_uri, None, "builtin")


def fetch_tree(store: ArtifactStore, uri: str, dest: Path) -> Path:
    """Download an S3 prefix / object into `dest`; unpack a single .tar.gz. Returns the
    folder holding the files."""
    try:
        files = download_prefix(store, uri, dest)
    except StorageError as exc:
        raise InputError(str(exc)) from exc
    tars = [f for f in files if f.name.endswith((".tar.gz", ".tgz"))]
    if len(files) == 1 and tars:
        try:
            with tarfile.open(tars[0]) as tar:
                tar.extractall(dest, filter="data")
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise InputError(f"{uri}: {tars[0].name} is not a readable .tar.gz archive "
                             f"({type(exc).__name__}: {exc})") from exc
        tars[0].unlink()
    return dest


def fetch_data(store: ArtifactStore, sources: JobSources, dest: Path) -> list[Path]:
    if sources.data_uri is None:
        return []
    try:
        if sources.data_type == "ManifestFile":
            files: list[Path] = []
            for i, uri in enumerate(read_manifest(store, sources.data_uri)):
                files += download_prefix(store, uri, dest / f"{i:05d}")
        else:
            files = download_prefix(store, sources.data_uri, dest)
    except StorageError as exc:
        raise InputError(f"TrainingDataSource: {exc}") from exc
    jsonl = sorted(f for f in files if f.suffix in (".jsonl", ".json"))
    if not jsonl:
        raise InputError(f"TrainingDataSource {sources.data_uri}: no .jsonl file found")
    return jsonl
