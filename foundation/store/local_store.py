"""The artifact store over a local directory: bucket b is the folder `<root>/b`, key k the
file `<root>/b/k` (foundation/store/storage.py makes it when no S3 endpoint is configured).

Contract, beyond `BucketStore`'s (foundation/store/store_base.py):
- Only keys live in bucket folders. A write goes to a temporary file in `<root>/.tmp/` and
  is renamed into place, so no temporary name ever shares a bucket's key space: every key
  a stat finds is listed, whatever it is named (`.tmp-` in it included). (A bucket folder
  on another file system than the root is written by a copy beside the object instead.)
- A key a file system cannot hold (a segment over NAME_MAX bytes, the path over PATH_MAX)
  is `KeyTooLong`, before any file call; a key that names a folder, or has a file as a
  parent, is no object (stat: None, delete: nothing to do).
- Owners: `<root>/.owners/<bucket>` holds the owning account (made by a hard link, so it
  appears whole and once: the first claim wins); `<root>/.accounts/<account>/<bucket>`
  indexes them per account (kept by claim, assign and release; built from the records the
  first time a store without it is used), so one account's buckets are found without
  reading every owner record. The index may name a bucket another account owns now (a
  record edited by hand): each entry is checked against its record; a record edited by
  hand is missing from its new owner's index until `eaglenest s3 owner` assigns it.
- `adopt_file(uri, path, owner)` checks the owner record as it renames the file into
  place, holding a shared lock (flock) on the record; `delete_bucket` and `assign` hold it
  exclusively. A write checked before its body arrived therefore never lands in a bucket
  deleted and re-created by another account meanwhile: it is OwnerChanged or NoSuchBucket.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from eaglenest.foundation.store.store_base import (
    BUCKET_URI,
    BucketNotEmpty,
    KeyTooLong,
    NoSuchBucket,
    ObjectInfo,
    OwnerChanged,
    S3Uri,
    StorageError,
    check_bucket,
    check_segments,
)

#: the longest file name and path (bytes) a key's segments and path may take
NAME_MAX, PATH_MAX = 255, 4095
_ACCOUNT = re.compile(r"^[0-9A-Za-z_-]{1,64}$")


class LocalStore:
    """Buckets are the folders of `root` (module docstring)."""

    def __init__(self, root: Path, default_account: str | None = None) -> None:
        self.root = root.resolve()
        self.default_account = default_account

    # -- owner records and their per-account index --
    def _owner_path(self, bucket: str) -> Path:
        return self.root / ".owners" / check_bucket(bucket)

    def _index(self, account_id: str) -> Path:
        if _ACCOUNT.match(account_id) is None:
            raise StorageError(f"{account_id!r} is not an account id")
        self._ensure_index()
        return self.root / ".accounts" / account_id

    def _ensure_index(self) -> None:
        """Build `.accounts/` from the owner records once (in a folder of its own, renamed
        into place whole: a store that has one never builds it again)."""
        index = self.root / ".accounts"
        if index.is_dir():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        build = Path(tempfile.mkdtemp(dir=self.root, prefix=".accounts-"))
        owners = self.root / ".owners"
        for record in owners.iterdir() if owners.is_dir() else []:
            with contextlib.suppress(OSError):
                owner = record.read_text().strip()
                if BUCKET_URI.match(f"s3://{record.name}") and _ACCOUNT.match(owner):
                    (build / owner).mkdir(exist_ok=True)
                    (build / owner / record.name).touch()
        try:
            build.rename(index)
        except OSError:  # another process's came first
            shutil.rmtree(build, ignore_errors=True)

    def _indexed(self, bucket: str, account_id: str, present: bool) -> None:
        entry = self._index(account_id) / bucket
        if present:
            entry.parent.mkdir(exist_ok=True)
            entry.touch()
        else:
            entry.unlink(missing_ok=True)

    def owner(self, bucket: str) -> str | None:
        try:
            return self._owner_path(bucket).read_text().strip() or None
        except FileNotFoundError:
            return None

    def claim(self, bucket: str, account_id: str) -> str:
        path = self._owner_path(bucket)
        self._index(account_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(account_id)
            os.link(tmp, path)  # fails if the record exists: the first link wins
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        owner = self.owner(bucket)
        if owner is None:
            raise StorageError(f"the owner record of bucket '{bucket}' is empty ({path})")
        if owner == account_id:
            self._indexed(bucket, account_id, True)
        return owner

    def assign(self, bucket: str, account_id: str) -> None:
        path = self._owner_path(bucket)
        self._index(account_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._record_lock(bucket, exclusive=True) as old:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as fh:
                fh.write(account_id)
            os.replace(tmp, path)  # whole, at once: a reader sees the old owner or the new
            self._indexed(bucket, account_id, True)
            if old is not None and old != account_id and _ACCOUNT.match(old):
                self._indexed(bucket, old, False)

    def release(self, bucket: str) -> None:
        old = self.owner(bucket)
        self._owner_path(bucket).unlink(missing_ok=True)
        if old is not None and _ACCOUNT.match(old):
            self._indexed(bucket, old, False)

    def buckets_of(self, account_id: str) -> dict[str, float]:
        found: dict[str, float] = {}
        folder = self._index(account_id)
        for entry in folder.iterdir() if folder.is_dir() else []:
            with contextlib.suppress(OSError, StorageError):
                record = self._owner_path(entry.name)
                if record.read_text().strip() == account_id:
                    found[entry.name] = record.stat().st_mtime
        return found

    @contextlib.contextmanager
    def _record_lock(self, bucket: str, exclusive: bool) -> Iterator[str | None]:
        """The owner of `bucket` while its record is locked (shared or exclusive); None,
        and no lock, when it has no record."""
        path = self._owner_path(bucket)
        for _ in range(100):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                yield None
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                try:  # still the record, not one replaced or removed while we waited?
                    current = os.fstat(fd).st_ino == os.stat(path).st_ino
                except FileNotFoundError:
                    current = False
                if current:
                    yield os.read(fd, 256).decode().strip() or None
                    return
            finally:
                os.close(fd)  # the lock goes with it
        raise StorageError(f"the owner record of bucket '{bucket}' keeps changing ({path})")

    # -- objects --
    def _path(self, uri: S3Uri) -> Path:
        check_segments(str(uri))  # a path would collapse 'a//b' to 'a/b'; S3 would not
        long = next((p for p in uri.key.split("/") if len(p.encode()) > NAME_MAX), None)
        if long is not None or len(f"{self.root}/{uri.bucket}/{uri.key}".encode()) > PATH_MAX:
            raise KeyTooLong(f"'{uri}': the local store cannot hold this key (a segment of "
                             f"more than {NAME_MAX} bytes, or a path of more than "
                             f"{PATH_MAX})")
        path = (self.root / uri.bucket / uri.key).resolve()
        if not path.is_relative_to(self.root / uri.bucket):
            raise StorageError(f"'{uri}' escapes its bucket")
        return path

    def _temporary(self) -> Path:
        """A new file in `<root>/.tmp/` (never a bucket: no bucket name starts with '.')."""
        folder = self.root / ".tmp"
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="write-")
        os.close(fd)
        return Path(tmp)

    def _place(self, tmp: Path, dest: Path) -> None:
        """Rename `tmp` into `dest` (copying it across file systems); `tmp` is gone after."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(tmp, dest)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # a bucket folder on another file system (mounted or linked there): the copy
            # is made beside the object, under a name seen in listings until renamed
            fd, name = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
            os.close(fd)
            staged = Path(name)
            try:
                shutil.copyfile(tmp, staged)
                os.replace(staged, dest)
            finally:
                staged.unlink(missing_ok=True)
            tmp.unlink()

    def put_bytes(self, uri: S3Uri, data: bytes) -> None:
        path, tmp = self._path(uri), self._temporary()
        try:
            tmp.write_bytes(data)
            self._place(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def get_bytes(self, uri: S3Uri) -> bytes:
        path = self._path(uri)
        if not path.is_file():
            raise StorageError(f"{uri} does not exist")
        return path.read_bytes()

    def list_keys(self, prefix: S3Uri) -> list[str]:
        base = self._path(S3Uri(prefix.bucket, ""))
        if not base.exists():
            return []
        keys = (p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix.key))

    def put_file(self, uri: S3Uri, path: Path) -> None:
        dest, tmp = self._path(uri), self._temporary()
        try:
            shutil.copyfile(path, tmp)
            self._place(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def get_file(self, uri: S3Uri, path: Path) -> None:
        src = self._path(uri)
        if not src.is_file():
            raise StorageError(f"{uri} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, path)

    def delete(self, uri: S3Uri) -> None:
        """Remove one object (no error if there is none: gone, a folder, below a file)."""
        path = self._path(uri)
        if uri.key and path.is_file():
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                path.unlink()

    def _info(self, key: str, path: Path) -> ObjectInfo | None:
        try:
            st = path.stat()
        except OSError:
            return None
        tag = hashlib.md5(f"{st.st_size}:{st.st_mtime_ns}".encode(), usedforsecurity=False)
        return ObjectInfo(key, st.st_size, st.st_mtime, f'"{tag.hexdigest()}"')

    def stat(self, uri: S3Uri) -> ObjectInfo | None:
        path = self._path(uri)
        return self._info(uri.key, path) if path.is_file() and uri.key else None

    def list_objects(self, prefix: S3Uri) -> list[ObjectInfo]:
        base = self._path(S3Uri(prefix.bucket, ""))
        found = (self._info(k, base / k) for k in self.list_keys(prefix))
        return [info for info in found if info is not None]

    def open_object(self, uri: S3Uri, start: int = 0, end: int | None = None) -> BinaryIO:
        path = self._path(uri)
        if not uri.key or not path.is_file():
            raise StorageError(f"{uri} does not exist")
        fh = path.open("rb")
        fh.seek(start)
        return fh

    def adopt_file(self, uri: S3Uri, path: Path, owner: str | None = None) -> None:
        dest = self._path(uri)
        if owner is None:
            self._place(path, dest)
            return
        with self._record_lock(uri.bucket, exclusive=False) as current:
            if current != owner:
                if current is None and not (self.root / uri.bucket).is_dir():
                    raise NoSuchBucket(uri.bucket)
                raise OwnerChanged(uri.bucket, owner)
            self._place(path, dest)

    # -- buckets --
    def buckets(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for folder in (self.root, self.root / ".owners"):
            for entry in folder.iterdir() if folder.is_dir() else []:
                if BUCKET_URI.match(f"s3://{entry.name}") is None or entry.is_symlink():
                    continue  # '.owners', '.tmp', temporary files: never a bucket
                with contextlib.suppress(OSError):
                    found.setdefault(entry.name, entry.stat().st_mtime)
        return found

    def bucket_exists(self, bucket: str) -> bool:
        return (self.root / check_bucket(bucket)).is_dir() or self.owner(bucket) is not None

    def create_bucket(self, bucket: str) -> None:
        (self.root / check_bucket(bucket)).mkdir(parents=True, exist_ok=True)

    def delete_bucket(self, bucket: str) -> None:
        folder = self.root / check_bucket(bucket)
        with self._record_lock(bucket, exclusive=True):  # no write commits meanwhile
            if self.list_keys(S3Uri(bucket, "")):
                raise BucketNotEmpty(f"s3://{bucket}/ is not empty")
            if folder.is_dir():
                for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts),
                                  reverse=True):
                    if sub.is_dir() and not sub.is_symlink():
                        sub.rmdir()  # empty folders only: an object written meanwhile stays
                folder.rmdir()
            self.release(bucket)
