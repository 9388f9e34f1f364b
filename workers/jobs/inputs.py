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
from typing import Any

from eaglenest.foundation.storage import ArtifactStore, StorageError, download_prefix, read_manifest

EAGLE_CHANNEL = "eagle_model"


class InputError(Exception):
    """A job input that cannot be used; the message is the job's FailureReason."""


@dataclass(frozen=True)
class JobSources:
    model_uri: str
    head_uri: str | None
    data_uri: str | None
    data_type: str  # S3Prefix | ManifestFile | builtin


def _container_uri(container: dict[str, Any]) -> tuple[str | None, str | None]:
    src = (container.get("ModelDataSource") or {}).get("S3DataSource") or {}
    model_uri = src.get("S3Uri") or container.get("ModelDataUrl")
    head_uri = None
    for extra in container.get("AdditionalModelDataSources") or []:
        if extra.get("ChannelName") == EAGLE_CHANNEL:
            head_uri = extra["S3DataSource"]["S3Uri"]
    return model_uri, head_uri


def resolve_sources(spec: dict[str, Any], model_spec: dict[str, Any] | None) -> JobSources:
    source = spec["ModelSource"]
    head_uri = None
    if source.get("S3"):
        model_uri = source["S3"]["S3Uri"]
    else:
        if model_spec is None:
            name = source["SageMakerModel"]["ModelName"]
            raise InputError(f"ModelSource.SageMakerModel: model {name} no longer exists")
        container = model_spec.get("PrimaryContainer") or (model_spec.get("Containers") or [{}])[0]
        found, head_uri = _container_uri(container)
        if not found:
            raise InputError("ModelSource.SageMakerModel: the model's container has neither "
                             "ModelDataSource.S3DataSource.S3Uri nor ModelDataUrl")
        model_uri = found
    cfg = spec["OptimizationConfigs"][0]["ModelSpeculativeDecodingConfig"]
    data = cfg.get("TrainingDataSource")
    if data:
        return JobSources(model_uri, head_uri, data["S3Uri"], data.get("S3DataType", "S3Prefix"))
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
