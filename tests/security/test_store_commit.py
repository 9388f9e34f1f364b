"""The store's own guarantees behind the S3 API (issue #51), in this process, no stack:
a write commits only into a bucket still its account's (CopyObject, PutObject and
CompleteMultipartUpload share the commit), owner lookups read only the caller's records,
and the upload sweeper aborts idle uploads and removes what a gone process staged."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from eaglenest.api.s3.uploads import sweep
from eaglenest.foundation.store.buckets import AccessDenied, AccountStore
from eaglenest.foundation.store.disk_usage import account_bytes
from eaglenest.foundation.store.storage import LocalStore, NoSuchBucket, S3Uri

ALICE, BOB = "111111111111", "222222222222"


def test_a_write_commits_only_into_its_accounts_bucket(tmp_path: Path) -> None:
    """The commit CopyObject, PutObject and Complete share (AccountStore.adopt_file): before,
    a view that had checked its bucket wrote into it after the bucket was deleted and
    re-created by another account (the owner cached, the folder re-created); after, it is
    AccessDenied, or NoSuchBucket when no one re-created it, and nothing is written."""
    store = LocalStore(tmp_path / "s3")
    # a request's view, and the view of a request of alice's made while its body arrives
    writer, alice, bob = (AccountStore(store, a) for a in (ALICE, ALICE, BOB))
    alice.create_bucket("swapped")
    writer.check_write("swapped")  # the write's first check
    alice.delete_bucket("swapped")
    bob.create_bucket("swapped")
    staged = tmp_path / "staged"
    staged.write_bytes(b"planted")
    with pytest.raises(AccessDenied):
        writer.adopt_file(S3Uri("swapped", "planted"), staged)
    assert bob.list_keys(S3Uri("swapped", "")) == []
    alice.create_bucket("gone")
    writer.check_write("gone")
    alice.delete_bucket("gone")
    with pytest.raises(NoSuchBucket):
        writer.adopt_file(S3Uri("gone", "planted"), staged)
    assert not (tmp_path / "s3" / "gone").exists() and staged.exists()


def test_owner_lookups_read_only_the_accounts_records(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every write's quota check (and ListBuckets) read every bucket's owner record:
    1000 reads with 1000 buckets of another account; after, only the caller's own."""
    store = LocalStore(tmp_path / "s3")
    for i in range(1000):
        store.claim(f"bob-{i:04d}", BOB)
    store.put_bytes(S3Uri("alice-a", "x"), b"1" * 10)
    store.claim("alice-a", ALICE)
    store.claim("alice-b", ALICE)
    reads: list[str] = []
    real = Path.read_text

    def counted(self: Path, *args: Any, **kw: Any) -> str:
        if self.parent.name == ".owners":
            reads.append(self.name)
        return real(self, *args, **kw)

    monkeypatch.setattr(Path, "read_text", counted)
    assert account_bytes(store, ALICE) == 10
    assert sorted(AccountStore(store, ALICE).my_buckets()) == ["alice-a", "alice-b"]
    assert len(reads) <= 4, len(reads)


def test_the_sweeper_aborts_idle_uploads_and_removes_leftovers(tmp_path: Path) -> None:
    """Uploads idle past the age go (and what a process that is gone left staged: bodies,
    a Complete cut short); uploads in use, and bodies this process is receiving, stay."""
    root = tmp_path / "s3-uploads"
    mine = root / "multipart" / ALICE
    idle, busy, cut = mine / ("0" * 32), mine / ("1" * 32), mine / (".completing-" + "2" * 32)
    for folder in (idle, busy, cut, root / "incoming"):
        folder.mkdir(parents=True)
    (idle / "1").write_bytes(b"x")
    old, new = root / "incoming" / "put-old", root / "incoming" / "put-new"
    old.write_bytes(b"o")
    new.write_bytes(b"n")
    now = time.time()
    for path in (idle, cut, old):
        os.utime(path, (now - 100, now - 100))
    assert sweep(tmp_path, 50, started=now - 10, now=now) == 1
    assert sorted(p.name for p in mine.iterdir()) == [busy.name]
    assert sorted(p.name for p in (root / "incoming").iterdir()) == ["put-new"]
