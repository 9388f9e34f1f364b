"""Training checkpoints mirrored to the artifact store, so any worker host can resume a job.

A worker keeps its checkpoints in its local work dir (fast resume on the same host). Each
one is also uploaded under ``<prefix>`` (the job's output location + ``_checkpoints/``):

    <prefix>step-00000050/...   the checkpoint's files (head + trainer_state.pt)
    <prefix>latest              the name of the newest complete checkpoint, written last

The pointer is written only after every file of the checkpoint is uploaded, so a worker
killed mid-upload leaves the previous checkpoint as ``latest``; the older uploaded
checkpoint is deleted after the pointer moves. A worker on another host that finds no local
checkpoint downloads the one ``latest`` names and resumes from it.

What the store holds is data, never a path: the pointer must name a checkpoint as the
trainer names them (``step-`` and at least 8 digits), and every downloaded key's part below
the checkpoint's prefix must be a relative path that stays in the checkpoint's folder
(``foundation.store.storage.local_path``). Otherwise `restore` raises StorageError naming the
pointer or the key and writes nothing; `upload` logs a bad pointer and replaces it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from eaglenest.foundation.store.storage import (
    ArtifactStore,
    S3Uri,
    StorageError,
    local_path,
    parse_uri,
)

log = logging.getLogger("eaglenest.optimize")

POINTER = "latest"
#: the names models/training/train.py gives checkpoints (``f"step-{step:08d}"``)
CHECKPOINT_NAME = re.compile(r"step-[0-9]{8,20}")


class CheckpointSync:
    def __init__(self, store: ArtifactStore, prefix: str) -> None:
        self.store, self.prefix = store, prefix.rstrip("/") + "/"

    def _uri(self, relative: str) -> S3Uri:
        return parse_uri(self.prefix + relative)

    def remote_latest(self) -> str | None:
        """The checkpoint the remote pointer names; None when there is no pointer.
        StorageError naming the pointer when it names anything but a checkpoint."""
        uri = self._uri(POINTER)
        try:
            name = self.store.get_bytes(uri).decode(errors="replace").strip()
        except StorageError:
            return None
        if name and CHECKPOINT_NAME.fullmatch(name) is None:
            raise StorageError(f"{uri} holds {ascii(name[:80])}, not a checkpoint name "
                               "(step-NNNNNNNN); refused")
        return name or None

    def upload(self, ckpt: Path) -> None:
        """Upload one local checkpoint folder, then move the pointer, then drop the old one."""
        try:
            previous = self.remote_latest()
        except StorageError as exc:  # overwritten below; what it named is left alone
            log.warning("%s", exc)
            previous = None
        for f in sorted(p for p in ckpt.rglob("*") if p.is_file()):
            self.store.put_file(self._uri(f"{ckpt.name}/{f.relative_to(ckpt).as_posix()}"), f)
        self.store.put_bytes(self._uri(POINTER), ckpt.name.encode())
        if previous and previous != ckpt.name:
            self._delete_under(self._uri(previous + "/"))

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
        # every key is checked before the first byte is written
        files = [(parse_uri(f"s3://{base.bucket}/{key}"),
                  local_path(dest, key[len(base.key):], f"s3://{base.bucket}/{key}"))
                 for key in keys]
        for uri, path in files:
            self.store.get_file(uri, path)
        local.write_text(name)
        log.info("restored checkpoint %s from %s", name, self.prefix)
        return True

    def clear(self) -> None:
        """Remove every uploaded checkpoint (after the job's outputs are published)."""
        self._delete_under(self._uri(""))

    def _delete_under(self, prefix: S3Uri) -> None:
        """Delete every object under `prefix`; a key no URI may name (`a//b`, written with
        the store's own credentials) is logged and left."""
        for key in self.store.list_keys(prefix):
            try:
                self.store.delete(parse_uri(f"s3://{prefix.bucket}/{key}"))
            except StorageError as exc:
                log.warning("checkpoint cleanup left an object: %s", exc)
