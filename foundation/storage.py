"""The artifact store: `s3://bucket/key` URIs over real S3 (boto3, any endpoint_url: AWS,
MinIO, moto_server) or over a local directory (`<data-dir>/s3/bucket/key`).

Both implement the same small interface; callers never branch on which one they hold.
Multi-file outputs are published file by file with a `_MANIFEST.json` written last, so a
reader that sees the manifest sees every file it lists (single PUTs are atomic in S3; the
local store writes to a temporary name and renames).

Buckets belong to accounts: each store keeps, per bucket, the 12-digit account that owns it
(`owner`), set once by the first `claim` (race-safe: of two accounts claiming a new bucket at
once exactly one wins, and both are told which), or by an operator (`assign`, `release`:
`eaglenest s3 owner`). The record lives in the store itself, out of every bucket's key
space: `<root>/.owners/<bucket>` in the local store, the reserved key `.eaglenest/owner` in
S3 (refused by `parse_uri`, hidden from listings). A store also knows the operator's default
account (`default_account`, set by `make_store`): the only account that may read a bucket no
account owns. Every access made for an account goes through its view,
`foundation.buckets.AccountStore`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

from eaglenest.foundation.settings import Settings

MANIFEST = "_MANIFEST.json"
#: the key prefix that holds a bucket's owner record in S3; no URI may name it
RESERVED_PREFIX = ".eaglenest/"
OWNER_KEY = RESERVED_PREFIX + "owner"
_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(?P<key>.*))?$")


class StorageError(Exception):
    """A user-actionable storage failure (bad URI, missing object)."""


class BucketNotEmpty(StorageError):
    """A bucket to delete still holds objects."""


@dataclass(frozen=True)
class ObjectInfo:
    """One object: its key, size in bytes, last modification (POSIX seconds) and an opaque
    entity tag (S3's ETag, quotes included; the local store derives it from size and
    modification time: it changes when the object is rewritten, it is not an MD5)."""

    key: str
    size: int
    mtime: float
    etag: str


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    key: str  # no leading slash; may be "" (the bucket) or end with "/" (a prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def child(self, relative: str) -> S3Uri:
        base = self.key if not self.key or self.key.endswith("/") else self.key + "/"
        return parse_uri(f"s3://{self.bucket}/{base}{relative}")


def parse_uri(uri: str) -> S3Uri:
    """Parse and check an S3 URI; reject keys that would escape their bucket.

    >>> parse_uri("s3://bucket/a/b.txt")
    S3Uri(bucket='bucket', key='a/b.txt')
    """
    m = _URI.match(uri)
    if m is None:
        raise StorageError(f"'{uri}' is not an S3 URI of the form s3://bucket/key")
    key = m["key"] or ""
    check_characters(uri)
    check_segments(uri)
    if "\\" in key or any(p in ("..", ".") for p in key.split("/")):
        raise StorageError(f"'{uri}': keys may not contain '.', '..', '\\' or a leading '/'")
    if key == RESERVED_PREFIX.rstrip("/") or key.startswith(RESERVED_PREFIX):
        raise StorageError(f"'{uri}': keys under {RESERVED_PREFIX} are reserved for the store")
    return S3Uri(m["bucket"], key)


def check_characters(uri: str) -> None:
    """StorageError for a URI with a control character (NUL included): no key may hold one."""
    control = next((c for c in uri if ord(c) < 32 or ord(c) == 127), None)
    if control is not None:
        raise StorageError(f"{ascii(uri)}: keys may not contain control characters "
                           f"(found {ascii(control)})")


def check_segments(uri: str) -> None:
    """StorageError naming `uri` when its key has an empty segment: a leading '/' or a '//'
    (`s3://b//k`, `s3://b/a//k`). S3 keeps such keys as written while a path built from one
    collapses or restarts them (`dest / "/k"` is `/k`), so no URI may hold one."""
    if "//" in uri.removeprefix("s3://"):
        raise StorageError(f"'{uri}': keys may not contain empty segments ('//') or a "
                           "leading '/'")


def local_path(dest: Path, relative: str, uri: str) -> Path:
    """`dest / relative`, where `relative` is the part of the stored key `uri` below the
    prefix being fetched; StorageError naming `uri` unless the path stays inside `dest`: no
    leading '/', no empty, '.' or '..' segment, no '\\', and inside `dest` once resolved
    (through any link already there), no control character."""
    check_characters(uri)
    parts = relative.split("/")
    if "\\" in relative or any(p in ("", ".", "..") for p in parts):
        raise StorageError(f"'{uri}': the key's part {relative!r} below the prefix is not a "
                           "relative path without empty, '.' or '..' segments; refused")
    target = dest.joinpath(*parts)
    if not target.resolve().is_relative_to(dest.resolve()):
        raise StorageError(f"'{uri}': {target} leaves {dest}; refused")
    return target


def regular_files(folder: Path) -> list[Path]:
    """Every file under `folder`, sorted; StorageError naming the first symbolic link found
    (a link could make an upload copy a file from anywhere on the host, such as a key)."""
    if folder.is_symlink():
        raise StorageError(f"{folder} is a symbolic link; upload the folder it points to")
    files = []
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise StorageError(f"{path} is a symbolic link (to {os.readlink(path)}); "
                               "uploads copy regular files only")
        if path.is_file():
            files.append(path)
    return files


class ArtifactStore(Protocol):
    def put_bytes(self, uri: S3Uri, data: bytes) -> None: ...
    def get_bytes(self, uri: S3Uri) -> bytes: ...
    def list_keys(self, prefix: S3Uri) -> list[str]: ...
    def put_file(self, uri: S3Uri, path: Path) -> None: ...
    def get_file(self, uri: S3Uri, path: Path) -> None: ...
    def delete(self, uri: S3Uri) -> None: ...


class BucketStore(ArtifactStore, Protocol):
    """A whole store (LocalStore, S3Store): objects plus the owner of each bucket."""

    #: the operator's default account, the only one that may read a bucket no account owns
    #: (None: no account may; `make_store` sets Settings.account_id)
    default_account: str | None

    def owner(self, bucket: str) -> str | None:
        """The account that owns `bucket`, or None while no account does."""
        ...

    def claim(self, bucket: str, account_id: str) -> str:
        """Make `account_id` the owner of `bucket` unless an account already is (atomic:
        of concurrent claims exactly one wins); the owner after the call."""
        ...

    def assign(self, bucket: str, account_id: str) -> None:
        """The operator's: make `account_id` the owner of `bucket`, replacing any owner."""
        ...

    def release(self, bucket: str) -> None:
        """The operator's: leave `bucket` with no owner (no error if it has none)."""
        ...

    # -- what the S3-compatible API (api/s3) needs besides the calls above --
    def stat(self, uri: S3Uri) -> ObjectInfo | None:
        """The object at `uri`, or None when there is none."""
        ...

    def list_objects(self, prefix: S3Uri) -> list[ObjectInfo]:
        """The objects whose keys start with `prefix.key`, sorted by key."""
        ...

    def open_object(self, uri: S3Uri, start: int = 0, end: int | None = None) -> BinaryIO:
        """A reader of bytes `start`..`end` (inclusive; None: to the end) of the object;
        StorageError when it does not exist. The caller closes it."""
        ...

    def adopt_file(self, uri: S3Uri, path: Path) -> None:
        """Store the file `path` as the object `uri` (whole, at once) and remove `path`."""
        ...

    def buckets(self) -> dict[str, float]:
        """Every bucket (the ones with an owner record included) -> its creation time."""
        ...

    def bucket_exists(self, bucket: str) -> bool: ...

    def create_bucket(self, bucket: str) -> None:
        """Make `bucket` exist (no error if it does); ownership is `claim`'s."""
        ...

    def delete_bucket(self, bucket: str) -> None:
        """Remove an empty bucket and its owner record; BucketNotEmpty if it holds objects."""
        ...


def check_bucket(bucket: str) -> str:
    """`bucket` if it is a valid bucket name, else StorageError naming it."""
    if _URI.match(f"s3://{bucket}") is None:
        raise StorageError(f"'{bucket}' is not a bucket name")
    return bucket


class LocalStore:
    """Buckets are the folders of `root`; the owner of bucket b is the file
    `root/.owners/b` (no bucket name starts with '.'), made by a hard link so it appears
    at once, whole, and only once."""

    def __init__(self, root: Path, default_account: str | None = None) -> None:
        self.root = root.resolve()
        self.default_account = default_account

    def _owner_path(self, bucket: str) -> Path:
        return self.root / ".owners" / check_bucket(bucket)

    def owner(self, bucket: str) -> str | None:
        try:
            return self._owner_path(bucket).read_text().strip() or None
        except FileNotFoundError:
            return None

    def claim(self, bucket: str, account_id: str) -> str:
        path = self._owner_path(bucket)
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
        return owner

    def assign(self, bucket: str, account_id: str) -> None:
        path = self._owner_path(bucket)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as fh:
            fh.write(account_id)
        os.replace(tmp, path)  # whole, at once: a reader sees the old owner or the new

    def release(self, bucket: str) -> None:
        self._owner_path(bucket).unlink(missing_ok=True)

    def _path(self, uri: S3Uri) -> Path:
        check_segments(str(uri))  # a path would collapse 'a//b' to 'a/b'; S3 would not
        path = (self.root / uri.bucket / uri.key).resolve()
        if not path.is_relative_to(self.root / uri.bucket):
            raise StorageError(f"'{uri}' escapes its bucket")
        return path

    def put_bytes(self, uri: S3Uri, data: bytes) -> None:
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)

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
        return sorted(k for k in keys if k.startswith(prefix.key) and ".tmp-" not in k)

    def put_file(self, uri: S3Uri, path: Path) -> None:
        dest = self._path(uri)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        os.close(fd)
        shutil.copyfile(path, tmp)
        os.replace(tmp, dest)

    def get_file(self, uri: S3Uri, path: Path) -> None:
        src = self._path(uri)
        if not src.is_file():
            raise StorageError(f"{uri} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, path)

    def delete(self, uri: S3Uri) -> None:
        """Remove one object (no error if it is already gone)."""
        self._path(uri).unlink(missing_ok=True)

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

    def adopt_file(self, uri: S3Uri, path: Path) -> None:
        dest = self._path(uri)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, dest)  # same file system: at once
        except OSError:
            self.put_file(uri, path)
            path.unlink()

    def buckets(self) -> dict[str, float]:
        found: dict[str, float] = {}
        for folder in (self.root, self.root / ".owners"):
            for entry in folder.iterdir() if folder.is_dir() else []:
                if _URI.match(f"s3://{entry.name}") is None or entry.is_symlink():
                    continue  # '.owners', temporary files: never a bucket
                with contextlib.suppress(OSError):
                    found.setdefault(entry.name, entry.stat().st_mtime)
        return found

    def bucket_exists(self, bucket: str) -> bool:
        return (self.root / check_bucket(bucket)).is_dir() or self.owner(bucket) is not None

    def create_bucket(self, bucket: str) -> None:
        (self.root / check_bucket(bucket)).mkdir(parents=True, exist_ok=True)

    def delete_bucket(self, bucket: str) -> None:
        folder = self.root / check_bucket(bucket)
        if self.list_keys(S3Uri(bucket, "")):
            raise BucketNotEmpty(f"s3://{bucket}/ is not empty")
        if folder.is_dir():
            for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
                if sub.is_dir() and not sub.is_symlink():
                    sub.rmdir()  # empty folders only: an object written meanwhile stays
            folder.rmdir()
        self.release(bucket)


def make_store(settings: Settings) -> BucketStore:
    """S3 when EAGLENEST_S3_ENDPOINT_URL is set, else the local directory store; either
    with the operator's default account (Settings.account_id)."""
    if settings.s3_endpoint_url:
        # boto3 is imported only where S3 is configured (foundation/s3_store.py)
        from eaglenest.foundation.s3_store import S3Store

        return S3Store(settings.s3_endpoint_url, settings.region, settings.account_id)
    return LocalStore(settings.artifact_dir, settings.account_id)


def download_prefix(store: ArtifactStore, uri: str, dest: Path) -> list[Path]:
    """Fetch one object, or every object under a prefix, into `dest` (keys relative to the
    prefix). Raises StorageError if nothing is there."""
    src = parse_uri(uri)
    keys = store.list_keys(src)
    exact = [k for k in keys if k == src.key]
    if exact and not src.key.endswith("/"):
        target = dest / PurePosixPath(src.key).name
        store.get_file(src, target)
        return [target]
    base = src.key if not src.key or src.key.endswith("/") else src.key + "/"
    under = [k for k in keys if k.startswith(base)]
    if not under:
        raise StorageError(f"nothing found at {uri}")
    # every target is checked before the first byte is written
    targets = [local_path(dest, k[len(base):], f"s3://{src.bucket}/{k}") for k in under]
    for key, target in zip(under, targets, strict=True):
        store.get_file(S3Uri(src.bucket, key), target)
    return targets


def read_manifest(store: ArtifactStore, uri: str) -> list[str]:
    """A SageMaker ManifestFile: `[{"prefix": "s3://b/p/"}, "rel/key1", ...]` -> object URIs."""
    try:
        doc = json.loads(store.get_bytes(parse_uri(uri)))
        prefix = doc[0]["prefix"]
        rels = doc[1:]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise StorageError(
            f"{uri} is not a manifest file: expected [{{\"prefix\": \"s3://...\"}}, \"key\", ...]"
        ) from exc
    base = parse_uri(prefix)
    return [str(base.child(rel)) for rel in rels]


def publish_dir(store: ArtifactStore, local: Path, dest: str) -> list[str]:
    """Upload a directory under `dest/`, then `_MANIFEST.json` listing it (written last)."""
    base = parse_uri(dest if dest.endswith("/") else dest + "/")
    files = regular_files(local)
    rels = [p.relative_to(local).as_posix() for p in files]
    for path, rel in zip(files, rels, strict=True):
        store.put_file(base.child(rel), path)
    store.put_bytes(base.child(MANIFEST), json.dumps({"files": rels}, indent=1).encode())
    return [str(base.child(r)) for r in rels]
