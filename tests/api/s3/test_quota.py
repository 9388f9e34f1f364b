"""The stored-bytes quota (EAGLENEST_MAX_STORED_BYTES, foundation/store/disk_usage.py) on the S3
API: a PutObject or UploadPart that would take the account past it is refused with
QuotaExceeded and writes nothing; replacing an object counts only the difference; staged
parts count until their upload is completed or aborted (so a Complete never passes it). A
stack of its own, with an 8 MiB quota."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from botocore.exceptions import ClientError

from tests.api.s3.conftest import s3_client
from tests.support.stack import Stack

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("s3quota"), extra_env={
        "EAGLENEST_WORKER_QUEUES": "", "EAGLENEST_MAX_STORED_BYTES": str(8 * MIB)}).start()
    yield s
    s.stop()


def test_quota(small: Stack) -> None:
    s3 = s3_client(small)
    s3.create_bucket(Bucket="quota")
    s3.put_object(Bucket="quota", Key="five", Body=b"5" * (5 * MIB))
    s3.put_object(Bucket="quota", Key="five", Body=b"6" * (5 * MIB))  # a replacement
    with pytest.raises(ClientError) as exc:
        s3.put_object(Bucket="quota", Key="four", Body=b"4" * (4 * MIB))
    err = exc.value.response
    assert (err["Error"]["Code"], err["ResponseMetadata"]["HTTPStatusCode"]) == \
        ("QuotaExceeded", 403)
    assert "EAGLENEST_MAX_STORED_BYTES" in err["Error"]["Message"]
    up = s3.create_multipart_upload(Bucket="quota", Key="mpu")["UploadId"]
    with pytest.raises(ClientError) as exc:
        s3.upload_part(Bucket="quota", Key="mpu", UploadId=up, PartNumber=1,
                       Body=b"p" * (5 * MIB))
    assert exc.value.response["Error"]["Code"] == "QuotaExceeded"
    part = s3.upload_part(Bucket="quota", Key="mpu", UploadId=up, PartNumber=1,
                          Body=b"p" * MIB)
    s3.delete_object(Bucket="quota", Key="five")
    with pytest.raises(ClientError) as exc:  # the staged MiB counts
        s3.put_object(Bucket="quota", Key="seven", Body=b"7" * (7 * MIB + 1))
    assert exc.value.response["Error"]["Code"] == "QuotaExceeded"
    s3.complete_multipart_upload(Bucket="quota", Key="mpu", UploadId=up, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]})
    s3.put_object(Bucket="quota", Key="seven", Body=b"7" * (7 * MIB - 1))
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="quota")["Contents"]] == \
        ["mpu", "seven"]
