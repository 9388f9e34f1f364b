"""A multi-gigabyte object through the S3 API (slow: `-m slow`): 3 GiB uploaded in 64 MiB
parts by boto3's transfer manager, then a single 1 GiB PutObject; the server's resident
memory stays far below the object's size (bodies stream to disk), and the stored bytes
are the sent ones (ranges at both ends and the size)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from boto3.s3.transfer import TransferConfig

from tests.api.s3.conftest import s3_client
from tests.support.stack import Stack

GIB = 1024**3


@pytest.fixture(scope="module")
def big_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("s3large"),
              extra_env={"EAGLENEST_WORKER_QUEUES": ""}).start()
    yield s
    s.stop()


def _peak_rss(pid: int, stop: threading.Event, out: list[int]) -> None:
    proc = psutil.Process(pid)
    while not stop.is_set():
        total = 0
        for p in [proc, *proc.children(recursive=True)]:
            try:
                total = max(total, p.memory_info().rss)
            except psutil.Error:
                continue
        out.append(total)
        time.sleep(0.2)


def _file(path: Path, size: int) -> Path:
    with path.open("wb") as fh:
        fh.write(b"head-of-file")
        fh.seek(size - 12)
        fh.write(b"end-of-file!")
    return path


@pytest.mark.slow
def test_multi_gigabyte_upload(big_stack: Stack, tmp_path: Path) -> None:
    s3 = s3_client(big_stack)
    s3.create_bucket(Bucket="large")
    samples: list[int] = []
    stop = threading.Event()
    assert big_stack.proc is not None
    watcher = threading.Thread(target=_peak_rss, args=(big_stack.proc.pid, stop, samples))
    watcher.start()
    try:
        big = _file(tmp_path / "big", 3 * GIB)
        s3.upload_file(str(big), "large", "big", Config=TransferConfig(
            multipart_threshold=64 * 1024**2, multipart_chunksize=64 * 1024**2,
            max_concurrency=4))
        big.unlink()
        one = _file(tmp_path / "one", GIB)
        with one.open("rb") as fh:
            s3.put_object(Bucket="large", Key="one", Body=fh)
    finally:
        stop.set()
        watcher.join()
    for key, size in (("big", 3 * GIB), ("one", GIB)):
        assert s3.head_object(Bucket="large", Key=key)["ContentLength"] == size
        assert s3.get_object(Bucket="large", Key=key, Range="bytes=0-11")["Body"].read() == \
            b"head-of-file"
        assert s3.get_object(Bucket="large", Key=key, Range="bytes=-12")["Body"].read() == \
            b"end-of-file!"
    print(f"peak server RSS {max(samples) / 1024**2:.0f} MiB")
    assert max(samples) < 512 * 1024**2, f"peak RSS {max(samples)} bytes"
