"""Data Capture durability (api/runtime/capture.py): a record is on disk when `add()` returns, a
SIGKILLed API's records are uploaded by the next one, a failed upload is kept and retried;
records go only into a bucket of the endpoint's account."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from eaglenest.api.runtime.capture import CaptureWriter
from eaglenest.foundation.store.storage import LocalStore, S3Uri

DEST = "s3://capture/traffic"
ACCT = "111111111111"  # the endpoint's account


def stored(root: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((root / "capture").rglob("*.jsonl"))
            for line in p.read_text().splitlines()]


def wait(pred, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_a_record_is_on_disk_when_add_returns(tmp_path: Path) -> None:
    writer = CaptureWriter(LocalStore(tmp_path / "s3"), tmp_path / "spool", flush_seconds=3600)
    try:
        for i in range(3):
            writer.add(DEST, "ep", "v", {"n": i}, ACCT)
            (spooled,) = writer.own_dir.glob("*.jsonl")
            assert [json.loads(x)["n"] for x in spooled.read_text().splitlines()] == \
                list(range(i + 1))
        assert stored(tmp_path / "s3") == []  # not rolled yet
    finally:
        writer.close()
    (obj,) = (tmp_path / "s3" / "capture" / "traffic" / "ep" / "v").rglob("*.jsonl")
    assert [r["n"] for r in stored(tmp_path / "s3")] == [0, 1, 2]
    assert not writer.own_dir.exists()


KILLED = textwrap.dedent("""
    import os, signal
    from pathlib import Path
    from eaglenest.api.runtime.capture import CaptureWriter
    from eaglenest.foundation.store.storage import LocalStore
    w = CaptureWriter(LocalStore(Path({root!r}) / "s3"), Path({root!r}) / "spool", 3600)
    for i in range(20):
        w.add("s3://capture/traffic", "ep", "v", {{"n": i}}, "111111111111")
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_records_of_a_killed_api_are_uploaded_by_the_next(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", KILLED.format(root=str(tmp_path))],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert stored(tmp_path / "s3") == []
    writer = CaptureWriter(LocalStore(tmp_path / "s3"), tmp_path / "spool", flush_seconds=3600)
    try:
        wait(lambda: len(stored(tmp_path / "s3")) == 20)
        assert [r["n"] for r in stored(tmp_path / "s3")] == list(range(20))
        assert [p.name for p in (tmp_path / "spool").iterdir()] == [writer.own_dir.name]
    finally:
        writer.close()


def test_a_spool_started_during_an_upload_is_not_uploaded_open(tmp_path: Path) -> None:
    """A record added while an upload lists the spool folder (a request beside the flush
    thread) lands in a file the upload leaves alone: none is lost into an unlinked file."""
    writer = CaptureWriter(LocalStore(tmp_path / "s3"), tmp_path / "spool", flush_seconds=3600)
    started: list[int] = []

    class Racing(type(writer.own_dir)):  # type: ignore[misc]
        def glob(self, pattern: str, **kw):  # type: ignore[no-untyped-def, override]
            if not started:  # a request's record arrives as the upload lists the folder
                started.append(1)
                writer.add(DEST, "ep", "v", {"n": 1}, ACCT)
            return super().glob(pattern, **kw)

    try:
        writer.own_dir = Racing(writer.own_dir)
        writer.flush([])  # uploads closed files only: the new one is open
        assert started and stored(tmp_path / "s3") == []
        writer.add(DEST, "ep", "v", {"n": 2}, ACCT)
    finally:
        writer.close()
    assert [r["n"] for r in stored(tmp_path / "s3")] == [1, 2]


class FlakyStore(LocalStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.down = True

    def put_bytes(self, uri: S3Uri, data: bytes) -> None:
        if self.down:
            raise OSError("store unavailable")
        super().put_bytes(uri, data)


def test_a_failed_upload_is_kept_and_retried(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "s3")
    writer = CaptureWriter(store, tmp_path / "spool", flush_seconds=0.2)
    try:
        writer.add(DEST, "ep", "v", {"n": 1}, ACCT)
        writer.flush()
        assert stored(tmp_path / "s3") == [] and list(writer.own_dir.glob("*.jsonl"))
        store.down = False
        writer.add(DEST, "ep", "v", {"n": 2}, ACCT)
        wait(lambda: sorted(r["n"] for r in stored(tmp_path / "s3")) == [1, 2])
    finally:
        writer.close()
    assert os.listdir(tmp_path / "spool") == []


def test_capture_into_another_accounts_bucket_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s3")
    assert store.claim("capture", "222222222222") == "222222222222"  # owner changed
    writer = CaptureWriter(store, tmp_path / "spool", flush_seconds=3600)
    try:
        writer.add(DEST, "ep", "v", {"n": 1}, ACCT)
        writer.flush()
        assert stored(tmp_path / "s3") == []  # nothing written into the other's bucket
        assert not list(writer.own_dir.glob("*.json*"))  # dropped, not retried forever
        writer.add("s3://mine/traffic", "ep", "v", {"n": 2}, ACCT)
        writer.flush()
    finally:
        writer.close()
    assert store.owner("mine") == ACCT  # the first capture claimed its bucket
    assert list((tmp_path / "s3" / "mine" / "traffic" / "ep" / "v").rglob("*.jsonl"))
