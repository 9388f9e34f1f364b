"""Data Capture: sampled request/response pairs as JSONL in OpenAI format, in files rolled
by time and size under `DestinationS3Uri/<endpoint>/<variant>/YYYY/MM/DD/HH/`.

Durability contract:
- `add()` appends the record's line to a spool file on local disk
  (``<spool>/<api-process>/<file>.jsonl``, one per destination, endpoint (by ARN: two
  accounts' endpoints of one name never share a file) and variant) and
  flushes it to the operating system before it returns. The runtime proxy calls it before
  the reply's last byte is sent, so every record of a request answered 200 is on disk when
  the caller has its answer: a SIGKILL of the API loses at most the requests in flight.
  Records are not fsynced: a crash of the host itself may lose the last ones.
- A spool file is rolled into the store as it stands (one object, complete JSONL, so the
  prefix is directly a TrainingDataSource) when it is older than `flush_seconds`, larger
  than `max_bytes`, or the API stops; then it is deleted. An upload that fails is retried
  at the next roll (capture never fails a request).
- Spool files an API process left behind (killed, or its upload failed) are uploaded by the
  next CaptureWriter on the same spool directory once that process is gone.
- Each record is written for the endpoint's account, through its view of the store
  (foundation/store/buckets.py): a destination bucket another account owns (one that changed
  owner after CreateEndpointConfig) is refused, and its spool file dropped with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from eaglenest.api.runtime import disk_quota
from eaglenest.foundation.host.children import Identity
from eaglenest.foundation.host.loops import Loop
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.buckets import AccessDenied, AccountStore
from eaglenest.foundation.store.storage import BucketStore, parse_uri

log = logging.getLogger("eaglenest.capture")


@dataclass
class _Spool:
    path: Path
    handle: IO[str]
    started: float = field(default_factory=time.time)
    size: int = 0


class CaptureWriter:
    def __init__(self, store: BucketStore, spool_dir: Path, flush_seconds: float = 60.0,
                 max_bytes: int = 4 * 1024 * 1024,
                 limits: disk_quota.Limits | None = None) -> None:
        """`limits`: the per-account disk quotas (api/runtime/disk_quota.py; None: the
        environment's Settings)."""
        self.store, self.flush_seconds, self.max_bytes = store, flush_seconds, max_bytes
        self.spool_dir = spool_dir
        self.quota = disk_quota.DiskQuota(store, spool_dir,
                                          limits or disk_quota.Limits.of(Settings()))
        me = Identity.of(os.getpid())
        self.own_dir = spool_dir / f"{os.getpid()}-{me.start if me else 0}"
        self.own_dir.mkdir(parents=True, exist_ok=True)
        self._open: dict[tuple[str, str, str, str, str], _Spool] = {}
        self._lock = threading.Lock()
        self._upload_lock = threading.Lock()
        # the flush thread survives whatever a round raises (foundation/host/loops.py): logged,
        # retried after a back-off; what was spooled waits on disk for that round
        self._loop = Loop("capture-flush", self._round, min(flush_seconds, 5.0), first=True,
                          logger=log).start()

    def add(self, destination: str, endpoint: str, variant: str, record: dict[str, Any],
            account_id: str, arn: str = "") -> None:
        """Append and flush one record of `account_id`'s endpoint `endpoint` (its name, as
        the S3 prefix has it; `arn`: its ARN) (see the module docstring); never raises."""
        line = json.dumps(record) + "\n"
        if not self.quota.admit(account_id, len(line)):  # per-account disk quotas
            return
        key = (destination, arn, endpoint, variant, account_id)
        try:
            with self._lock:
                spool = self._open.get(key) or self._start(key)
                spool.handle.write(line)
                spool.handle.flush()
                spool.size += len(line)
                full = spool.size >= self.max_bytes
        except OSError as exc:  # capture must never break serving
            log.warning("data capture for %s/%s not spooled: %s", endpoint, variant, exc)
            return
        if full:
            self.flush([key])

    def _start(self, key: tuple[str, str, str, str, str]) -> _Spool:
        stem = self.own_dir / uuid.uuid4().hex[:12]
        started = time.time()
        meta = {"destination": key[0], "arn": key[1], "endpoint": key[2], "variant": key[3],
                "account": key[4], "started": started}
        stem.with_suffix(".json").write_text(json.dumps(meta))
        spool = _Spool(stem.with_suffix(".jsonl"),
                       open(stem.with_suffix(".jsonl"), "a", encoding="utf-8"),  # noqa: SIM115
                       started)
        self._open[key] = spool
        return spool

    def flush(self, keys: list[tuple[str, str, str, str, str]] | None = None) -> None:
        """Close the spool files of `keys` (all when None) and upload every closed one."""
        with self._lock:
            for k in list(self._open) if keys is None else keys:
                spool = self._open.pop(k, None)
                if spool is not None:
                    spool.handle.close()
        self._upload(self.own_dir)

    def _upload(self, folder: Path) -> None:
        """Upload the closed spool files of `folder` (its open ones stay).

        Files are listed before the open ones are read: `_start` creates a file and records
        it as open under one hold of the lock, so a listed file missing from `busy` is
        closed. (Read the other way round, a file started in between would be uploaded
        while open and its later records written into an unlinked file.)"""
        with self._upload_lock:
            listed = sorted(folder.glob("*.json"))
            with self._lock:
                busy = {s.path for s in self._open.values()}
            for meta_path in listed:
                data = meta_path.with_suffix(".jsonl")
                if data not in busy:
                    self._upload_one(meta_path, data)

    def _upload_one(self, meta_path: Path, data: Path) -> None:
        try:
            meta = json.loads(meta_path.read_text())
            body = data.read_bytes() if data.exists() else b""
        except (OSError, ValueError) as exc:
            log.warning("unreadable capture spool %s: %s", meta_path, exc)
            return
        if body:
            stamp = time.gmtime(meta["started"])
            name = f"{time.strftime('%M-%S', stamp)}-{data.stem}"
            uri = parse_uri(meta["destination"].rstrip("/") + "/").child(
                f"{meta['endpoint']}/{meta['variant']}/{time.strftime('%Y/%m/%d/%H', stamp)}/"
                f"{name}.jsonl")
            try:
                if "account" not in meta:  # spooled before buckets had owners
                    raise AccessDenied(str(uri), uri.bucket, "(unknown)")
                AccountStore(self.store, meta["account"]).put_bytes(uri, body)
            except AccessDenied as exc:  # not this account's bucket: never will be by retrying
                log.warning("data capture to %s refused, %d records dropped: %s", uri,
                            body.count(b"\n"), exc)
            except Exception as exc:  # kept on disk: retried at the next roll
                log.warning("data capture to %s failed (%d records kept for a retry): %s",
                            uri, body.count(b"\n"), exc)
                return
        data.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)

    def recover(self) -> None:
        """Upload what API processes that are gone left in the spool directory."""
        for folder in sorted(p for p in self.spool_dir.iterdir() if p.is_dir()):
            if folder == self.own_dir or _owner_alive(folder.name):
                continue
            self._upload(folder)
            if not any(folder.glob("*.json")):
                shutil.rmtree(folder, ignore_errors=True)

    def _round(self) -> None:
        """One round of the flush thread: roll what is due, upload earlier failed rolls and
        what API processes that are gone left behind (the first round: only that)."""
        with self._lock:
            due = [k for k, s in self._open.items()
                   if time.time() - s.started >= self.flush_seconds]
        self.flush(due)  # uploads earlier failed rolls too
        self.recover()

    def close(self) -> None:
        self._loop.stop(timeout=30)
        self.flush()
        if not any(self.own_dir.glob("*.json")):
            shutil.rmtree(self.own_dir, ignore_errors=True)


def _owner_alive(folder: str) -> bool:
    """A spool folder is named `<pid>-<start time>` after the API process that writes it."""
    pid, _, start = folder.partition("-")
    if not (pid.isdigit() and start.isdigit()):
        return False
    return Identity(int(pid), int(start)).alive()
