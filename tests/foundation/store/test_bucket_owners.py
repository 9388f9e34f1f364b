"""Bucket owners in both stores (local, S3 via moto_server): an operator assigns or releases
one; the first of two accounts writing into a new bucket at once owns it, the other is
refused; a view reads a bucket no account owns only for the store's default account."""

from __future__ import annotations

import threading

import pytest

from eaglenest.foundation.store.buckets import AccessDenied, AccountStore
from eaglenest.foundation.store.storage import parse_uri
from tests.foundation.store.test_storage import A, B, moto_url, new_bucket, store  # noqa: F401


def test_assign_replaces_and_release_clears_the_owner(store):  # noqa: F811
    bucket = new_bucket(store, "given")
    store.release(bucket)  # no owner: nothing to do, no error
    assert store.owner(bucket) is None
    store.assign(bucket, A)
    assert store.owner(bucket) == A
    store.assign(bucket, B)  # replaces
    assert store.owner(bucket) == B
    assert store.claim(bucket, A) == B  # a claim takes nothing from an owner
    store.release(bucket)
    assert store.owner(bucket) is None
    assert store.claim(bucket, A) == A  # released: the next claim (a write) wins it


def test_of_two_accounts_writing_a_new_bucket_at_once_one_owns_it(store):  # noqa: F811
    for i in range(4):
        bucket = new_bucket(store, f"write-race-{i}")
        barrier, outcomes = threading.Barrier(2), dict[str, str]()

        def write(account: str, bucket: str = bucket, barrier=barrier,
                  outcomes=outcomes) -> None:
            barrier.wait()
            try:
                AccountStore(store, account).put_bytes(parse_uri(f"s3://{bucket}/{account}"),
                                                       account.encode())
                outcomes[account] = "wrote"
            except AccessDenied:
                outcomes[account] = "denied"

        threads = [threading.Thread(target=write, args=(a,)) for a in (A, B)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(outcomes.values()) == ["denied", "wrote"]
        winner = next(a for a, o in outcomes.items() if o == "wrote")
        assert store.owner(bucket) == winner
        assert store.list_keys(parse_uri(f"s3://{bucket}/")) == [winner]


def test_only_the_default_account_reads_an_unowned_bucket(store):  # noqa: F811
    bucket = new_bucket(store, "placed")
    store.put_bytes(parse_uri(f"s3://{bucket}/x"), b"x")  # the operator's, no owner
    store.default_account = None  # a store made outside make_store: no account reads it
    for account in (A, B):
        with pytest.raises(AccessDenied, match="has no owner"):
            AccountStore(store, account).get_bytes(parse_uri(f"s3://{bucket}/x"))
    store.default_account = A
    assert AccountStore(store, A).list_keys(parse_uri(f"s3://{bucket}/")) == ["x"]
    with pytest.raises(AccessDenied, match=f"--account {B}"):
        AccountStore(store, B).list_keys(parse_uri(f"s3://{bucket}/"))
    assert store.owner(bucket) is None
