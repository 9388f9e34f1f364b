"""Fetching a model's artifacts and its draft head from the artifact store, for a job
(workers/jobs/) and an endpoint (workers/serving/) alike.

- which container a model serves from (`model_container`) and where its artifacts and its
  head (the `eagle_model` channel of AdditionalModelDataSources) are (`container_uris`);
- `fetch_tree`: an S3 prefix or object downloaded to a folder, a single .tar.gz unpacked.

A missing or unreadable input raises InputError, whose message is the resource's
FailureReason.
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path

from eaglenest.foundation.shapes import AwsShape
from eaglenest.foundation.shapes.models import ContainerDefinition, CreateModelInput
from eaglenest.foundation.store.storage import ArtifactStore, StorageError, download_prefix

EAGLE_CHANNEL = "eagle_model"


class InputError(Exception):
    """A job or endpoint input that cannot be used; the message is the FailureReason."""


def given(shape: AwsShape | None) -> bool:
    """A member the request set with at least one member of its own (``{}`` is absent)."""
    return shape is not None and bool(shape.model_fields_set)


def model_container(model: CreateModelInput) -> ContainerDefinition:
    """The container a model serves from: PrimaryContainer, else the first of Containers."""
    if model.PrimaryContainer is not None and given(model.PrimaryContainer):
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
