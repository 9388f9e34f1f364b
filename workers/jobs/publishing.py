"""A job's outputs published under its output prefix, within the account's stored bytes."""

from __future__ import annotations

from pathlib import Path

from eaglenest.foundation.store.disk_usage import (
    StoredBytesExceeded,
    check_stored,
    clear_prefix,
    dir_bytes,
)
from eaglenest.foundation.store.storage import ArtifactStore, parse_uri, publish_dir


def publish_outputs(store: ArtifactStore, out: Path, base: str, max_stored_bytes: int) -> None:
    """Upload the folder `out` under the prefix `base` when it fits in the account's
    EAGLENEST_MAX_STORED_BYTES (what the job wrote under its prefix is replaced and does not
    count); else the job's prefix is cleared (checkpoints, training log: nothing of it stays)
    and StoredBytesExceeded fails the job before a byte is uploaded."""
    prefix = parse_uri(base)
    try:
        check_stored(store, max_stored_bytes, dir_bytes(out), prefix)
    except StoredBytesExceeded:
        clear_prefix(store, prefix)
        raise
    publish_dir(store, out, base)
