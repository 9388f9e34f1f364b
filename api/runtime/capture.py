"""Data Capture: sampled request/response pairs as JSONL in OpenAI format, in files rolled
by time and size under `DestinationS3Uri/<endpoint>/<variant>/YYYY/MM/DD/HH/`.

Records are buffered per (destination, endpoint, variant) and written as one object when
the buffer is older than `flush_seconds` or larger than `max_bytes`, and when the API stops.
Each object is complete JSONL, so the prefix is directly a TrainingDataSource.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from eaglenest.foundation.storage import ArtifactStore, parse_uri

log = logging.getLogger("eaglenest.capture")


@dataclass
class _Buffer:
    started: float = field(default_factory=time.time)
    lines: list[str] = field(default_factory=list)
    size: int = 0


class CaptureWriter:
    def __init__(self, store: ArtifactStore, flush_seconds: float = 60.0,
                 max_bytes: int = 4 * 1024 * 1024) -> None:
        self.store, self.flush_seconds, self.max_bytes = store, flush_seconds, max_bytes
        self._buffers: dict[tuple[str, str, str], _Buffer] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="capture-flush", daemon=True)
        self._thread.start()

    def add(self, destination: str, endpoint: str, variant: str, record: dict[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        key = (destination, endpoint, variant)
        with self._lock:
            buf = self._buffers.setdefault(key, _Buffer())
            buf.lines.append(line)
            buf.size += len(line)
            full = buf.size >= self.max_bytes
        if full:
            self.flush(key)

    def flush(self, key: tuple[str, str, str] | None = None) -> None:
        with self._lock:
            keys = [key] if key else list(self._buffers)
            taken = [(k, self._buffers.pop(k)) for k in keys if k in self._buffers]
        for (destination, endpoint, variant), buf in taken:
            stamp = time.strftime("%Y/%m/%d/%H", time.gmtime(buf.started))
            name = f"{time.strftime('%M-%S', time.gmtime(buf.started))}-{uuid.uuid4().hex[:12]}"
            uri = parse_uri(destination.rstrip("/") + "/").child(
                f"{endpoint}/{variant}/{stamp}/{name}.jsonl")
            try:
                self.store.put_bytes(uri, "".join(buf.lines).encode())
            except Exception as exc:  # capture must never break serving
                log.warning("data capture to %s failed (%d records lost): %s", uri,
                            len(buf.lines), exc)

    def _loop(self) -> None:
        while not self._stop.wait(min(self.flush_seconds, 5.0)):
            with self._lock:
                due = [k for k, b in self._buffers.items()
                       if time.time() - b.started >= self.flush_seconds]
            for k in due:
                self.flush(k)

    def close(self) -> None:
        self._stop.set()
        self.flush()
