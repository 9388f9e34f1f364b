"""Training checkpoints mirrored to the artifact store, so any worker host can resume a job.

A worker keeps its checkpoints in its local work dir (fast resume on the same host). Each
one is also uploaded under ``<prefix>`` (the job's output location + ``_checkpoints/``):

    <prefix>step-00000050/...   the checkpoint's files (head + trainer_state.pt)
    <prefix>latest              the name of the newest complete checkpoint, written last

The pointer is written only after every file of the checkpoint is uploaded, so a worker
killed mid-upload leaves the previous checkpoint as ``latest``; the older uploaded
checkpoint is deleted after the pointer moves. A worker on another host that finds no local
checkpoint downloads the one ``latest`` names and resumes from it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from eaglenest.foundation.storage import ArtifactStore, StorageError, parse_uri

log = logging.getLogger("eaglenest.optimize")

POINTER = "latest"


class CheckpointSync:
    def __init__(self, store: ArtifactStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix.rstrip("/") + "/"

    def _uri(self, relative: str):  # noqa: ANN202 - S3Uri
        return parse_uri(self.prefix + relative)

    def remote_latest(self) -> str | None:
        try:
            return self.store.get_bytes(self._uri(POINTER)).decode().strip() or None
        except StorageError:
            return None

    def upload(self, ckpt: Path) -> None:
        """Upload one local checkpoint folder, then move the pointer, then drop the old one."""
        previous = self.remote_latest()
        for f in sorted(p for p in ckpt.rglob("*") if p.is_file()):
            self.store.put_file(self._uri(f"{ckpt.name}/{f.relative_to(ckpt).as_posix()}"), f)
        self.store.put_bytes(self._uri(POINTER), ckpt.name.encode())
        if previous and previous != ckpt.name:
            for key in self.store.list_keys(self._uri(previous + "/")):
                bucket = parse_uri(self.prefix).bucket
                self.store.delete(parse_uri(f"s3://{bucket}/{key}"))

    def restore(self, out_dir: Path) -> bool:
        """Download the remote latest checkpoint into ``out_dir/checkpoints`` when the local
        dir has none; True if ``out_dir`` now holds a checkpoint to resume from."""
        local = out_dir / "checkpoints" / POINTER
        if local.is_file():
            return True
        name = self.remote_latest()
        if name is None:
            return False
        dest = out_dir / "checkpoints" / name
        base = self._uri(name + "/")
        keys = self.store.list_keys(base)
        if not keys:
            return False
        for key in keys:
            relative = key[len(base.key):]
            self.store.get_file(parse_uri(f"s3://{base.bucket}/{key}"), dest / relative)
        local.write_text(name)
        log.info("restored checkpoint %s from %s", name, self.prefix)
        return True

    def clear(self) -> None:
        """Remove every uploaded checkpoint (after the job's outputs are published)."""
        bucket = parse_uri(self.prefix).bucket
        for key in self.store.list_keys(self._uri("")):
            self.store.delete(parse_uri(f"s3://{bucket}/{key}"))
