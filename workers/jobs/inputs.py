"""Where a job's model, data and optional starting head come from, and fetching its data
(the model and the head are fetched by workers/infra/model_fetch.py).

- model: `ModelSource.S3.S3Uri`, or the `ModelDataSource` / `ModelDataUrl` of the
  container of `ModelSource.SageMakerModel` (an S3 prefix, a single object or a .tar.gz);
- starting head ("bring your own EAGLE"): that container's AdditionalModelDataSources
  entry with ChannelName `eagle_model`;
- data: `TrainingDataSource` (S3Prefix or ManifestFile), else built-in datasets
  (`EAGLENEST_DATASET`, default: all of them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglenest.foundation.shapes.models import CreateModelInput
from eaglenest.foundation.shapes.optimization_jobs import CreateOptimizationJobRequest
from eaglenest.foundation.store.storage import (
    ArtifactStore,
    StorageError,
    download_prefix,
    read_manifest,
)
from eaglenest.workers.infra.model_fetch import InputError, container_uris, given, model_container


@dataclass(frozen=True)
class JobSources:
    model_uri: str
    head_uri: str | None
    data_uri: str | None
    data_type: str  # S3Prefix | ManifestFile | builtin


def resolve_sources(job: CreateOptimizationJobRequest,
                    model: CreateModelInput | None) -> JobSources:
    source = job.ModelSource
    head_uri = None
    if source.S3 is not None and given(source.S3):
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
