"""boto3's s3 client (path-style, unmodified but for endpoint_url) against a running stack:
objects, listings, ranges, multipart, buckets and their owners, S3's error codes."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.api.s3.conftest import Key, s3_client
from tests.support.stack import ACCOUNT, Stack

KEY = "dir/sp ace+plus%25é.txt"


def code_of(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    err = exc.value.response
    return err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]


def test_put_get_head_delete(s3: Any, bucket: str) -> None:
    put = s3.put_object(Bucket=bucket, Key=KEY, Body=b"hello world")
    got = s3.get_object(Bucket=bucket, Key=KEY)
    assert got["Body"].read() == b"hello world"
    assert got["ETag"] == put["ETag"] and got["ContentLength"] == 11
    head = s3.head_object(Bucket=bucket, Key=KEY)
    assert head["ContentLength"] == 11 and head["ETag"] == put["ETag"]
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    assert s3.get_object(Bucket=bucket, Key="empty")["Body"].read() == b""
    s3.delete_object(Bucket=bucket, Key=KEY)
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key=KEY)
    assert code_of(exc) == ("NoSuchKey", 404)
    with pytest.raises(ClientError) as exc:
        s3.head_object(Bucket=bucket, Key=KEY)
    assert code_of(exc) == ("404", 404)
    s3.delete_object(Bucket=bucket, Key="never-there")  # S3: 204 all the same


def test_range_get(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="r", Body=b"0123456789")
    for rng, want in (("bytes=2-5", b"2345"), ("bytes=7-", b"789"), ("bytes=-3", b"789"),
                      ("bytes=8-100", b"89")):
        got = s3.get_object(Bucket=bucket, Key="r", Range=rng)
        assert (got["Body"].read(), got["ResponseMetadata"]["HTTPStatusCode"]) == (want, 206)
    assert s3.get_object(Bucket=bucket, Key="r", Range="bytes=2-5")["ContentRange"] == \
        "bytes 2-5/10"
    with pytest.raises(ClientError) as exc:
        s3.get_object(Bucket=bucket, Key="r", Range="bytes=10-")
    assert code_of(exc) == ("InvalidRange", 416)


def test_list_prefix_delimiter_pages(s3: Any, bucket: str) -> None:
    keys = ["a/1", "a/2", "a/b/3", "b/4", "c", "d+e f"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    listed = s3.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == keys
    assert listed["Contents"][0]["Size"] == 3 and listed["KeyCount"] == 6
    top = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["a/", "b/"]
    assert [o["Key"] for o in top["Contents"]] == ["c", "d+e f"]
    under = s3.list_objects_v2(Bucket=bucket, Prefix="a/", Delimiter="/")
    assert [o["Key"] for o in under["Contents"]] == ["a/1", "a/2"]
    assert [p["Prefix"] for p in under["CommonPrefixes"]] == ["a/b/"]
    pages = list(s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 2}))
    assert [len(p.get("Contents", [])) for p in pages] == [2, 2, 2]
    assert [o["Key"] for p in pages for o in p["Contents"]] == keys
    folded = list(s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 1}))
    assert [x for p in folded for x in [c["Prefix"] for c in p.get("CommonPrefixes", [])]
            + [o["Key"] for o in p.get("Contents", [])]] == ["a/", "b/", "c", "d+e f"]
    assert s3.list_objects_v2(Bucket=bucket, StartAfter="b/4")["KeyCount"] == 2
    v1 = s3.list_objects(Bucket=bucket, Prefix="a/")
    assert [o["Key"] for o in v1["Contents"]] == ["a/1", "a/2", "a/b/3"]


def test_delete_objects(s3: Any, bucket: str) -> None:
    for key in ("x/1", "x/2", "y"):
        s3.put_object(Bucket=bucket, Key=key, Body=b".")
    out = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "x/1"}, {"Key": "x/2"},
                                                               {"Key": "../up"}]})
    assert sorted(d["Key"] for d in out["Deleted"]) == ["x/1", "x/2"]
    assert [(e["Key"], e["Code"]) for e in out["Errors"]] == [("../up", "InvalidArgument")]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["y"]


def test_multipart_api(s3: Any, bucket: str) -> None:
    first, last = b"a" * (5 * 1024 * 1024), b"tail"
    up = s3.create_multipart_upload(Bucket=bucket, Key="big/file")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="big/file", UploadId=up, PartNumber=1,
                        Body=first)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="big/file", UploadId=up, PartNumber=2,
                        Body=last)["ETag"]
    parts = s3.list_parts(Bucket=bucket, Key="big/file", UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, len(first)), (2, 4)]
    with pytest.raises(ClientError) as exc:
        s3.complete_multipart_upload(Bucket=bucket, Key="big/file", UploadId=up,
                                     MultipartUpload={"Parts": [
                                         {"PartNumber": 1, "ETag": '"0000"'}]})
    assert code_of(exc) == ("InvalidPart", 400)
    s3.complete_multipart_upload(Bucket=bucket, Key="big/file", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert s3.get_object(Bucket=bucket, Key="big/file")["Body"].read() == first + last
    gone = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    s3.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=gone)
    with pytest.raises(ClientError) as exc:
        s3.upload_part(Bucket=bucket, Key="k", UploadId=gone, PartNumber=1, Body=b"x")
    assert code_of(exc) == ("NoSuchUpload", 404)


def test_buckets_belong_to_accounts(s3: Any, other: Any, other_key: Key, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="secret", Body=b"alice's")
    assert bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert s3.list_buckets()["Owner"]["ID"] == ACCOUNT
    assert bucket not in [b["Name"] for b in other.list_buckets()["Buckets"]]
    for call in (lambda: other.get_object(Bucket=bucket, Key="secret"),
                 lambda: other.put_object(Bucket=bucket, Key="x", Body=b"bob's"),
                 lambda: other.list_objects_v2(Bucket=bucket),
                 lambda: other.delete_object(Bucket=bucket, Key="secret"),
                 lambda: other.delete_bucket(Bucket=bucket),
                 lambda: other.create_multipart_upload(Bucket=bucket, Key="x")):
        with pytest.raises(ClientError) as exc:
            call()
        assert code_of(exc) == ("AccessDenied", 403)
    with pytest.raises(ClientError) as exc:
        other.head_bucket(Bucket=bucket)
    assert code_of(exc) == ("403", 403)
    with pytest.raises(ClientError) as exc:
        other.create_bucket(Bucket=bucket)
    assert code_of(exc) == ("BucketAlreadyExists", 409)
    with pytest.raises(ClientError) as exc:
        s3.create_bucket(Bucket=bucket)
    assert code_of(exc) == ("BucketAlreadyOwnedByYou", 409)
    mine = bucket[:50] + "-bob"
    other.create_bucket(Bucket=mine)
    other.put_object(Bucket=mine, Key="k", Body=b"bob's")
    assert [b["Name"] for b in other.list_buckets()["Buckets"]] == [mine]
    assert s3.get_object(Bucket=bucket, Key="secret")["Body"].read() == b"alice's"


def test_delete_bucket(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="a/b", Body=b".")
    with pytest.raises(ClientError) as exc:
        s3.delete_bucket(Bucket=bucket)
    assert code_of(exc) == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket=bucket, Key="a/b")
    s3.delete_bucket(Bucket=bucket)
    with pytest.raises(ClientError) as exc:
        s3.head_bucket(Bucket=bucket)
    assert code_of(exc) == ("404", 404)
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket=bucket, Key="k", Body=b".")
    assert code_of(exc) == ("NoSuchBucket", 404)
    with pytest.raises(ClientError) as exc:
        s3.list_objects_v2(Bucket="no-such-bucket-here")
    assert code_of(exc) == ("NoSuchBucket", 404)


def test_bucket_named_like_a_route(s3: Any, stack: Stack) -> None:
    """A bucket may be named `endpoints` (or `ping`): S3 is routed by the signing service."""
    s3.create_bucket(Bucket="endpoints")
    s3.put_object(Bucket="endpoints", Key="x/invocations", Body=b"just a key")
    assert s3.get_object(Bucket="endpoints", Key="x/invocations")["Body"].read() == \
        b"just a key"
    assert httpx.get(f"{stack.url}/ping").json()["status"] in ("ok", "degraded")


def test_auth_errors(stack: Stack, s3: Any, bucket: str) -> None:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    s3.put_object(Bucket=bucket, Key="k", Body=b"v")
    wrong = s3_client(stack, secret="not-the-secret")
    with pytest.raises(ClientError) as exc:
        wrong.get_object(Bucket=bucket, Key="k")
    assert code_of(exc) == ("SignatureDoesNotMatch", 403)
    unknown = s3_client(stack, key="AKIANOSUCHKEY0000000")
    with pytest.raises(ClientError) as exc:
        unknown.list_buckets()
    assert code_of(exc) == ("InvalidAccessKeyId", 403)
    unsigned = boto3.client("s3", endpoint_url=stack.url, region_name="us-east-1",
                            config=Config(signature_version=UNSIGNED,
                                          s3={"addressing_style": "path"}))
    for call in (lambda: unsigned.get_object(Bucket=bucket, Key="k"),
                 lambda: unsigned.put_object(Bucket=bucket, Key="k2", Body=b"x"),
                 lambda: unsigned.list_objects_v2(Bucket=bucket)):
        with pytest.raises(ClientError) as exc:
            call()
        assert code_of(exc) == ("AccessDenied", 403)
    raw = httpx.get(f"{stack.url}/{bucket}/k")
    assert raw.status_code == 403 and b"<Code>AccessDenied</Code>" in raw.content


def test_presigned_url(stack: Stack, s3: Any, bucket: str) -> None:
    """Query-string SigV4 (boto3 presigns with SigV2 unless told s3v4: refused)."""
    s3.put_object(Bucket=bucket, Key="p/q", Body=b"presigned body")
    v2 = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p/q"})
    assert httpx.get(v2).status_code == 403
    s3 = s3_client(stack, signature_version="s3v4")
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p/q"},
                                    ExpiresIn=60)
    assert httpx.get(url).content == b"presigned body"
    r = httpx.get(url.replace("p/q", "p/other"))
    assert r.status_code == 403 and b"SignatureDoesNotMatch" in r.content
    put = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "up"},
                                    ExpiresIn=60)
    assert httpx.put(put, content=b"via url").status_code == 200
    assert s3.get_object(Bucket=bucket, Key="up")["Body"].read() == b"via url"
