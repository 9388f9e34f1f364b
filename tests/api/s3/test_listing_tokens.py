"""ListObjectsV2's continuation tokens, written and read by foundation/page_tokens.py: a
listing pages through every key, and a token that is not ours is S3's InvalidArgument."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from eaglenest.foundation import page_tokens


def test_continuation_tokens_page_through_keys_and_prefixes(s3: Any, bucket: str) -> None:
    keys = ["a/1", "a/2", "b", "c/x", "d"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    seen, token = [], None
    while True:
        extra = {"ContinuationToken": token} if token else {}
        page = s3.list_objects_v2(Bucket=bucket, Delimiter="/", MaxKeys=2, **extra)
        seen += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        seen += [o["Key"] for o in page.get("Contents", [])]
        if not page["IsTruncated"]:
            break
        token = page["NextContinuationToken"]
        assert page_tokens.decode(token) in ("a/", "b", "c/", "d")
    assert sorted(seen) == ["a/", "b", "c/", "d"]


@pytest.mark.parametrize("token", ["%%%", page_tokens.encode(["not", "a key"])])
def test_a_token_that_is_not_ours_is_invalid_argument(s3: Any, bucket: str,
                                                      token: str) -> None:
    with pytest.raises(ClientError) as exc:
        s3.list_objects_v2(Bucket=bucket, ContinuationToken=token)
    error = exc.value.response["Error"]
    assert (error["Code"], error["Message"]) == (
        "InvalidArgument", "The continuation token provided is incorrect")
