"""The Data Capture flush thread survives an error (issue #35: it died on `OSError: [Errno
24] Too many open files` and spooled records waited for the next restart): the round that
failed is logged, and the next round rolls the records into the store."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from eaglenest.api.runtime.capture import CaptureWriter
from eaglenest.foundation.store.storage import LocalStore
from tests.api.runtime.test_capture import ACCT, DEST, stored, wait


def test_the_flush_thread_survives_too_many_open_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "eaglenest.capture")
    writer = CaptureWriter(LocalStore(tmp_path / "s3"), tmp_path / "spool", flush_seconds=0.2)
    real_flush = writer.flush
    failed: list[float] = []

    def flush(keys=None):  # type: ignore[no-untyped-def]
        if not failed:
            failed.append(time.monotonic())
            raise OSError(24, "Too many open files")
        real_flush(keys)

    monkeypatch.setattr(writer, "flush", flush)
    try:
        for n in range(3):
            writer.add(DEST, "ep", "v", {"n": n}, ACCT)
        wait(lambda: bool(failed))
        # rolled by the flush thread itself on a later round: no close(), no restart
        wait(lambda: sorted(r["n"] for r in stored(tmp_path / "s3")) == [0, 1, 2])
        writer.add(DEST, "ep", "v", {"n": 3}, ACCT)
        wait(lambda: len(stored(tmp_path / "s3")) == 4)
    finally:
        writer.close()
    assert any("capture-flush failed" in r.getMessage() and "Errno 24" in r.getMessage()
               for r in caplog.records)
