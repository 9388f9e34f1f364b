"""The S3 API shares the store fairly (issue #51), on one `eaglenest up` with a 16 MiB quota
(EAGLENEST_MAX_STORED_BYTES), 3 buckets per account (EAGLENEST_MAX_BUCKETS) and multipart
uploads aborted after 2 s idle (EAGLENEST_MULTIPART_MAX_AGE). Each test acts for accounts of
its own (a profile appended to the stack's credentials file), so quotas do not mix.

- staged multipart parts count against the quota, a streamed part as its bytes arrive, and
  are freed on Abort; ListMultipartUploads and ListParts page as S3's do; idle uploads go;
- a PUT whose body is still arriving when its bucket is deleted and re-created by another
  account writes nothing (the owner is checked again when the object is written);
- a body cut short commits nothing; a bucket past the per-account limit is TooManyBuckets;
- inputs the store cannot serve get S3's 4xx code (never a 500 and a traceback), and every
  key a HEAD finds is listed, `.tmp-` in its name or not."""

from __future__ import annotations

import http.client
import itertools
import select
import socket
import time
from collections.abc import Iterator

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.api.s3.conftest import s3_client
from tests.support.stack import REGION, Stack

MIB = 1024 * 1024
QUOTA = 16 * MIB
MAX_AGE = 2.0
_serial = itertools.count(1)


@pytest.fixture(scope="module")
def fair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("fair"), extra_env={
        "EAGLENEST_WORKER_QUEUES": "", "EAGLENEST_MAX_STORED_BYTES": str(QUOTA),
        "EAGLENEST_MAX_BUCKETS": "3", "EAGLENEST_MULTIPART_MAX_AGE": str(MAX_AGE)}).start()
    yield s
    s.stop()


class Account:
    """A fresh account of the stack: its key, boto3 client and raw requests."""

    def __init__(self, stack: Stack, key: str, secret: str, account_id: str) -> None:
        self.stack, self.key, self.secret, self.id = stack, key, secret, account_id
        self.s3 = s3_client(stack, key, secret)

    def signed(self, method: str, path: str, headers: dict[str, str] | None = None,
               payload: str = "UNSIGNED-PAYLOAD") -> dict[str, str]:
        """The headers of `method path` signed with this key, `payload` declared."""
        auth = _Declared(Credentials(self.key, self.secret), payload)
        req = AWSRequest(method=method, url=f"{self.stack.url}{path}", data=b"",
                         headers=dict(headers or {}))
        auth.add_auth(req)
        return {"Host": f"127.0.0.1:{self.stack.port}", **dict(req.headers.items())}

    def raw(self, method: str, path: str, body: bytes = b"",
            headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        sent = self.signed(method, path, {**(headers or {}), "Content-Length": str(len(body))})
        conn = http.client.HTTPConnection("127.0.0.1", self.stack.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in sent.items():
                conn.putheader(name, value)
            conn.endheaders(body)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def open_put(self, path: str, headers: dict[str, str]) -> socket.socket:
        """A connection that has sent the signed head of `PUT path` (no body yet)."""
        sent = self.signed("PUT", path, {k: v for k, v in headers.items()
                                         if k != "Transfer-Encoding"})
        sent.update({k: v for k, v in headers.items() if k == "Transfer-Encoding"})
        sock = socket.create_connection(("127.0.0.1", self.stack.port), timeout=30)
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in sent.items())
        sock.sendall((head + "\r\n").encode())
        return sock


class _Declared(S3SigV4Auth):
    def __init__(self, credentials: Credentials, payload: str) -> None:
        super().__init__(credentials, "s3", REGION)
        self.declared = payload

    def payload(self, request: AWSRequest) -> str:
        return self.declared


def new_account(stack: Stack) -> Account:
    n = next(_serial)
    key, secret, account_id = f"AKIAFAIR{n:012d}", f"fair-secret-{n:030d}", f"3{n:011d}"
    with (stack.data_dir / "credentials").open("a") as fh:
        fh.write(f"\n[fair-{n}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
                 f"eaglenest_account_id = {account_id}\n")
    time.sleep(0.01)  # a new mtime_ns for the key ring's stat
    return Account(stack, key, secret, account_id)


def code_of(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    err = exc.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]


def xml_code(body: bytes) -> str:
    return body.split(b"<Code>")[1].split(b"</Code>")[0].decode() if b"<Code>" in body else ""


def staged_bytes(stack: Stack) -> int:
    root = stack.data_dir / "s3-uploads"
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and
               not p.name.endswith(".json")) if root.is_dir() else 0


def response_of(sock: socket.socket) -> tuple[int, bytes]:
    r = http.client.HTTPResponse(sock, method="PUT")
    r.begin()
    return r.status, r.read()


def test_staged_parts_count_against_the_quota(fair: Stack) -> None:
    """Before: parts of any number of uploads were staged past the quota (172 MiB with a
    16 MiB one); after: the 4th 5 MiB part, and a PutObject while 15 MiB are staged, are
    QuotaExceeded; Abort frees them."""
    a = new_account(fair)
    a.s3.create_bucket(Bucket=f"staged-{a.id}")
    bucket = f"staged-{a.id}"
    ups = [a.s3.create_multipart_upload(Bucket=bucket, Key=f"k{i}")["UploadId"]
           for i in range(2)]
    for n in (1, 2):
        a.s3.upload_part(Bucket=bucket, Key="k0", UploadId=ups[0], PartNumber=n,
                         Body=b"p" * (5 * MIB))
    a.s3.upload_part(Bucket=bucket, Key="k1", UploadId=ups[1], PartNumber=1,
                     Body=b"q" * (5 * MIB))
    with pytest.raises(ClientError) as exc:
        a.s3.upload_part(Bucket=bucket, Key="k1", UploadId=ups[1], PartNumber=2,
                         Body=b"q" * (5 * MIB))
    assert code_of(exc) == ("QuotaExceeded", 403)
    assert "EAGLENEST_MAX_STORED_BYTES" in exc.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as exc:
        a.s3.put_object(Bucket=bucket, Key="obj", Body=b"o" * (2 * MIB))
    assert code_of(exc) == ("QuotaExceeded", 403)
    a.s3.abort_multipart_upload(Bucket=bucket, Key="k0", UploadId=ups[0])
    a.s3.put_object(Bucket=bucket, Key="obj", Body=b"o" * (2 * MIB))  # freed by the Abort
    a.s3.abort_multipart_upload(Bucket=bucket, Key="k1", UploadId=ups[1])


def test_a_streamed_part_is_checked_as_it_arrives(fair: Stack) -> None:
    """A chunked UploadPart with no length: before, 24 MiB were staged with a 16 MiB quota;
    after, QuotaExceeded once the part passes the quota, and nothing stays staged."""
    a = new_account(fair)
    bucket = f"stream-{a.id}"
    a.s3.create_bucket(Bucket=bucket)
    up = a.s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    before = staged_bytes(fair)
    sock = a.open_put(f"/{bucket}/k?partNumber=1&uploadId={up}",
                      {"Transfer-Encoding": "chunked"})
    sent = _stream_until_answered(sock, 24 * MIB)
    status, body = response_of(sock)
    sock.close()
    assert (status, xml_code(body)) == (403, "QuotaExceeded"), (status, body, sent)
    assert sent <= QUOTA + 8 * MIB  # refused as it arrived, not after it all came
    assert staged_bytes(fair) <= before
    parts = a.s3.list_parts(Bucket=bucket, Key="k", UploadId=up).get("Parts", [])
    assert parts == []
    a.s3.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=up)


def _stream_until_answered(sock: socket.socket, total: int) -> int:
    """Send up to `total` bytes of chunked body, 256 KiB a chunk, stopping as soon as the
    server answers; the bytes sent."""
    block, sent = b"s" * (256 * 1024), 0
    try:
        while sent < total:
            readable, writable, _ = select.select([sock], [sock], [], 10)
            if readable or not writable:
                return sent
            sock.sendall(b"%x\r\n%s\r\n" % (len(block), block))
            sent += len(block)
        sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server stopped reading: its answer is there
    return sent


def test_uploads_and_parts_are_listed(fair: Stack) -> None:
    """Before: ListMultipartUploads answered NotImplemented and ListParts never paged."""
    a, b = new_account(fair), new_account(fair)
    bucket = f"list-{a.id}"
    a.s3.create_bucket(Bucket=bucket)
    made = [(key, a.s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
            for key in ("a/1", "a/2", "b", "b", "c")]
    pages = list(a.s3.get_paginator("list_multipart_uploads").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 2}))
    assert len(pages) == 3 and pages[0]["IsTruncated"] and pages[0]["MaxUploads"] == 2
    listed = [(u["Key"], u["UploadId"]) for p in pages for u in p.get("Uploads", [])]
    assert listed == sorted(made, key=lambda m: m[0])  # by key, then by initiation
    first = pages[0]["Uploads"][0]
    assert first["Initiator"]["ID"] == first["Owner"]["ID"] == a.id
    assert first["StorageClass"] == "STANDARD" and first["Initiated"].year >= 2024
    grouped = a.s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in grouped["CommonPrefixes"]] == ["a/"]
    assert [u["Key"] for u in grouped["Uploads"]] == ["b", "b", "c"]
    assert [u["Key"] for u in a.s3.list_multipart_uploads(
        Bucket=bucket, Prefix="a/")["Uploads"]] == ["a/1", "a/2"]
    with pytest.raises(ClientError) as exc:
        b.s3.list_multipart_uploads(Bucket=bucket)
    assert code_of(exc) == ("AccessDenied", 403)
    key, up = made[-1]
    for n in (1, 2, 3):
        a.s3.upload_part(Bucket=bucket, Key=key, UploadId=up, PartNumber=n, Body=b"x" * n)
    parts = list(a.s3.get_paginator("list_parts").paginate(
        Bucket=bucket, Key=key, UploadId=up, PaginationConfig={"PageSize": 2}))
    assert [[(p["PartNumber"], p["Size"]) for p in page["Parts"]] for page in parts] == \
        [[(1, 1), (2, 2)], [(3, 3)]]
    assert parts[0]["NextPartNumberMarker"] == 2 and parts[0]["IsTruncated"]
    assert parts[0]["Initiator"]["ID"] == a.id
    for key, up in made:
        a.s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=up)
    assert "Uploads" not in a.s3.list_multipart_uploads(Bucket=bucket)


def test_idle_uploads_are_aborted(fair: Stack) -> None:
    """Before: an abandoned upload stayed, its parts with it; after: it is aborted once idle
    for EAGLENEST_MULTIPART_MAX_AGE (2 s here) and its bytes are freed."""
    a = new_account(fair)
    bucket = f"idle-{a.id}"
    a.s3.create_bucket(Bucket=bucket)
    up = a.s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    a.s3.upload_part(Bucket=bucket, Key="k", UploadId=up, PartNumber=1, Body=b"i" * MIB)
    deadline = time.monotonic() + MAX_AGE + 5
    while "Uploads" in a.s3.list_multipart_uploads(Bucket=bucket):
        assert time.monotonic() < deadline, "the idle upload was not aborted"
        time.sleep(0.2)
    with pytest.raises(ClientError) as exc:
        a.s3.list_parts(Bucket=bucket, Key="k", UploadId=up)
    assert code_of(exc) == ("NoSuchUpload", 404)
    assert not (fair.data_dir / "s3-uploads" / "multipart" / a.id / up).exists()


def test_a_cut_chunked_put_commits_nothing(fair: Stack) -> None:
    """An UNSIGNED-PAYLOAD PUT with a chunked body whose connection drops before the last
    chunk: before, the bytes that came were committed as the object; after, nothing is."""
    a = new_account(fair)
    bucket = f"cut-{a.id}"
    a.s3.create_bucket(Bucket=bucket)
    sock = a.open_put(f"/{bucket}/cut", {"Transfer-Encoding": "chunked"})
    sock.sendall(b"5\r\nhello\r\n")
    time.sleep(0.2)
    sock.shutdown(socket.SHUT_WR)
    time.sleep(0.3)
    sock.close()
    with pytest.raises(ClientError) as exc:
        a.s3.head_object(Bucket=bucket, Key="cut")
    assert code_of(exc) == ("404", 404)


def test_a_put_in_flight_never_lands_in_a_recreated_bucket(fair: Stack) -> None:
    """Mallory's PUT into her bucket is still sending its body when she deletes the bucket
    and Alice creates one of that name: before, the object landed in Alice's bucket (5 of 5
    tries); after, the PUT is AccessDenied and Alice's bucket stays empty."""
    mallory, alice = new_account(fair), new_account(fair)
    bucket = f"swap-{mallory.id}"
    mallory.s3.create_bucket(Bucket=bucket)
    body = b"m" * 4096
    sock = mallory.open_put(f"/{bucket}/planted", {"Content-Length": str(len(body))})
    sock.sendall(body[:100])
    time.sleep(0.3)  # the handler has checked the bucket and is reading the body
    mallory.s3.delete_bucket(Bucket=bucket)
    alice.s3.create_bucket(Bucket=bucket)
    sock.sendall(body[100:])
    status, answer = response_of(sock)
    sock.close()
    assert (status, xml_code(answer)) == (403, "AccessDenied"), answer
    assert "Contents" not in alice.s3.list_objects_v2(Bucket=bucket)
    assert not (fair.data_dir / "s3" / bucket / "planted").exists()
    # deleted and not re-created: NoSuchBucket, and no folder made for it
    mallory.s3.create_bucket(Bucket=f"{bucket}-2")
    sock = mallory.open_put(f"/{bucket}-2/planted", {"Content-Length": "4"})
    sock.sendall(b"ab")
    time.sleep(0.3)
    mallory.s3.delete_bucket(Bucket=f"{bucket}-2")
    sock.sendall(b"cd")
    status, answer = response_of(sock)
    sock.close()
    assert (status, xml_code(answer)) == (404, "NoSuchBucket"), answer
    assert not (fair.data_dir / "s3" / f"{bucket}-2").exists()


def test_buckets_per_account_are_capped(fair: Stack) -> None:
    """Before: an account created any number of buckets (5000: every write slowed); after:
    the 4th bucket with EAGLENEST_MAX_BUCKETS=3 is TooManyBuckets and creates nothing."""
    a = new_account(fair)
    names = [f"cap-{a.id}-{i}" for i in range(4)]
    for name in names[:3]:
        a.s3.create_bucket(Bucket=name)
    with pytest.raises(ClientError) as exc:
        a.s3.create_bucket(Bucket=names[3])
    assert code_of(exc) == ("TooManyBuckets", 400)
    mine = [b["Name"] for b in a.s3.list_buckets()["Buckets"]]
    assert sorted(mine) == names[:3]
    a.s3.delete_bucket(Bucket=names[0])
    a.s3.create_bucket(Bucket=names[3])


def test_unservable_inputs_get_s3_codes(fair: Stack) -> None:
    """Before: each of these answered 500 with a traceback in the log; after, S3's 4xx."""
    a = new_account(fair)
    bucket = f"inputs-{a.id}"
    a.s3.create_bucket(Bucket=bucket)
    a.s3.put_object(Bucket=bucket, Key="obj", Body=b"0123456789")
    long_segment = "s" * 300
    cases = [
        ("PUT", f"/{bucket}/{long_segment}", b"x", {}, 400, "KeyTooLongError"),
        ("PUT", f"/{bucket}/d/{long_segment}/k", b"x", {}, 400, "KeyTooLongError"),
        ("GET", f"/{bucket}/{long_segment}", b"", {}, 400, "KeyTooLongError"),
        ("POST", f"/{bucket}/{long_segment}?uploads", b"", {}, 400, "KeyTooLongError"),
        ("GET", f"/{bucket}/obj", b"", {"Range": "bytes=" + "9" * 5000 + "-"}, 416,
         "InvalidRange"),
        ("GET", f"/{bucket}/obj", b"", {"Range": "bytes=0-" + "9" * 5000}, 416,
         "InvalidRange"),
        ("POST", f"/{bucket}?delete", b"<Delete><Object><Key></Key></Object></Delete>",
         {}, 400, "MalformedXML"),
        ("POST", f"/{bucket}?delete", b"<Delete><Object></Object></Delete>", {}, 400,
         "MalformedXML"),
        ("PUT", f"/{bucket}/obj?partNumber={'1' * 5000}&uploadId={'0' * 32}", b"x", {},
         400, "InvalidArgument"),
        ("DELETE", f"/{bucket}/obj/under/a/file", b"", {}, 204, ""),
    ]
    logged = len(fair.log())
    for method, path, body, headers, status, code in cases:
        got, answer = a.raw(method, path, body, headers)
        assert (got, xml_code(answer)) == (status, code), (method, path[:80], answer[:300])
    a.s3.put_object(Bucket=bucket, Key="d/k", Body=b"x")
    got, answer = a.raw("DELETE", f"/{bucket}/d")  # a key that is a folder here: none
    assert got == 204, answer
    done = a.s3.delete_objects(Bucket=bucket, Delete={"Objects": [
        {"Key": long_segment}, {"Key": "d/k"}]})
    assert [e["Code"] for e in done.get("Errors", [])] == ["KeyTooLongError"]
    assert [d["Key"] for d in done["Deleted"]] == ["d/k"]
    assert "Traceback" not in fair.log()[logged:], fair.log()[logged:][-3000:]


def test_every_key_a_head_finds_is_listed(fair: Stack) -> None:
    """Before: keys with `.tmp-` in a segment vanished from listings (a leading one was
    refused); after, they are listed like any other."""
    a = new_account(fair)
    bucket = f"tmpkeys-{a.id}"
    a.s3.create_bucket(Bucket=bucket)
    keys = ["a.tmp-b", "dir/x.tmp-1", ".tmp-lead", "plain"]
    for key in keys:
        a.s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
        assert a.s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(key)
    listed = [o["Key"] for o in a.s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert listed == sorted(keys)
    assert not [p for p in (fair.data_dir / "s3" / bucket).rglob("*")
                if p.is_file() and p.relative_to(fair.data_dir / "s3" / bucket).as_posix()
                not in keys]
