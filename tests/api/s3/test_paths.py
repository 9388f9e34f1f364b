"""Keys and buckets that try to leave the store, through raw signed requests (the path sent
as written): `..` segments raw or encoded, encoded slashes, absolute keys, NUL, the owner
records, the staging folder, an upload id that is a path. Each is refused with S3's error
and nothing is written outside the store's bucket folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.s3.raw import send
from tests.support.stack import Stack

ESCAPES = [
    "/{b}/..%2F..%2Fescaped", "/{b}/a/../../escaped", "/{b}/%2E%2E/escaped",
    "/{b}/a/%2e%2e/%2e%2e/escaped", "/{b}/%2Fescaped", "/{b}//escaped",
    "/{b}/a%00b", "/{b}/.eaglenest/owner", "/{b}/a\\..\\..\\escaped", "/{b}/dir/",
]
BUCKETS = ["/.owners/{b}", "/..%2Fs3-uploads/escaped", "/%2E%2E/escaped", "/.owners",
           "/%2e%2e%2fcredentials"]


def files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("template", ESCAPES + BUCKETS)
def test_escapes_are_refused(stack: Stack, s3: Any, template: str) -> None:
    bucket = "paths-bucket"
    if bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=bucket)
    before = files(stack.data_dir)
    path = template.format(b=bucket)
    answer, _ = send(stack, "PUT", path, b"payload")
    assert answer.status == 400, (path, answer.status, answer.body)
    assert answer.body.split(b"<Code>")[1].split(b"</Code>")[0] in (
        b"InvalidArgument", b"InvalidBucketName"), answer.body
    new = files(stack.data_dir) - before
    assert not [p for p in new if p.suffix != ".log" and "stack" not in p.name], new
    got, _ = send(stack, "GET", path)
    assert got.status in (400, 403, 404), (path, got.status)
    assert b"payload" not in got.body


def test_reads_of_store_records_are_refused(stack: Stack, s3: Any) -> None:
    s3.create_bucket(Bucket="paths-read")
    for path in ("/paths-read/..%2F.owners%2Fpaths-read", "/paths-read/../credentials",
                 "/paths-read/..%2F..%2Fcredentials", "/.owners/paths-read"):
        answer, _ = send(stack, "GET", path)
        assert answer.status in (400, 403), (path, answer.status)
        assert b"aws_secret_access_key" not in answer.body
        assert b"123456789012" not in answer.body.split(b"<Message>")[0]


def test_upload_id_is_no_path(stack: Stack, s3: Any) -> None:
    s3.create_bucket(Bucket="paths-mpu")
    before = files(stack.data_dir)
    for upload_id in ("..%2F..%2Fescaped", "../x", "0" * 31 + "/"):
        answer, _ = send(stack, "PUT", f"/paths-mpu/k?partNumber=1&uploadId={upload_id}",
                         b"part")
        assert answer.status == 404 and b"NoSuchUpload" in answer.body
    assert files(stack.data_dir) - before <= {p for p in files(stack.data_dir)
                                              if p.name == "stack.log"}
