"""The store calls the S3 API uses (stat, list_objects, open_object, adopt_file, buckets,
create/delete bucket), the same over a local directory and over real S3 (moto_server), and
through an account's view (foundation/store/buckets.py AccountStore)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eaglenest.foundation.store.buckets import AccessDenied, AccountStore, BucketTaken
from eaglenest.foundation.store.storage import BucketNotEmpty, S3Uri, StorageError
from tests.foundation.store.test_storage import moto_url, store  # noqa: F401  (fixtures)


def test_objects(store: Any, tmp_path: Path) -> None:  # noqa: F811  (the fixture)
    store.create_bucket("bucket")
    staged = tmp_path / "staged"
    staged.write_bytes(b"0123456789")
    store.adopt_file(S3Uri("bucket", "d/obj"), staged)
    assert not staged.exists()
    info = store.stat(S3Uri("bucket", "d/obj"))
    assert (info.key, info.size) == ("d/obj", 10) and info.etag.startswith('"')
    assert store.stat(S3Uri("bucket", "d/none")) is None
    with store.open_object(S3Uri("bucket", "d/obj"), 3, 5) as reader:
        assert reader.read(3) == b"345"
    store.put_bytes(S3Uri("bucket", "d/a"), b"a")
    assert [o.key for o in store.list_objects(S3Uri("bucket", "d/"))] == ["d/a", "d/obj"]
    with pytest.raises(StorageError):
        store.open_object(S3Uri("bucket", "d/none"))


def test_buckets(store: Any) -> None:  # noqa: F811
    store.create_bucket("bucket")
    assert store.bucket_exists("bucket")
    assert not store.bucket_exists("nope-bucket")
    store.create_bucket("fresh-bucket")
    assert store.bucket_exists("fresh-bucket") and "fresh-bucket" in store.buckets()
    store.put_bytes(S3Uri("fresh-bucket", "a/b"), b"x")
    store.claim("fresh-bucket", "111111111111")
    with pytest.raises(BucketNotEmpty):
        store.delete_bucket("fresh-bucket")
    store.delete(S3Uri("fresh-bucket", "a/b"))
    store.delete_bucket("fresh-bucket")
    assert not store.bucket_exists("fresh-bucket") and store.owner("fresh-bucket") is None


def test_account_view(store: Any) -> None:  # noqa: F811
    alice, bob = AccountStore(store, "111111111111"), AccountStore(store, "222222222222")
    alice.create_bucket("alices")
    with pytest.raises(BucketTaken) as taken:
        bob.create_bucket("alices")
    assert not taken.value.mine
    with pytest.raises(BucketTaken) as taken:
        alice.create_bucket("alices")
    assert taken.value.mine
    assert "alices" in alice.my_buckets() and "alices" not in bob.my_buckets()
    for call in (lambda: bob.stat(S3Uri("alices", "k")),
                 lambda: bob.list_objects(S3Uri("alices", "")),
                 lambda: bob.open_object(S3Uri("alices", "k")),
                 lambda: bob.check_read("alices"), lambda: bob.delete_bucket("alices")):
        with pytest.raises(AccessDenied):
            call()
    alice.delete_bucket("alices")
