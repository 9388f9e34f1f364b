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
`foundation.store.buckets.AccountStore`.

The pieces: foundation/store/store_base.py (URIs, errors, the interfaces: all re-exported here),
foundation/store/local_store.py (`LocalStore`), foundation/store/s3_store.py (`S3Store`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath

from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.local_store import LocalStore
from eaglenest.foundation.store.store_base import (
    OWNER_KEY,
    RESERVED_PREFIX,
    ArtifactStore,
    BucketNotEmpty,
    BucketStore,
    KeyTooLong,
    NoSuchBucket,
    ObjectInfo,
    OwnerChanged,
    S3Uri,
    StorageError,
    check_bucket,
    check_characters,
    check_segments,
    parse_uri,
)

__all__ = [
    "MANIFEST", "OWNER_KEY", "RESERVED_PREFIX", "ArtifactStore", "BucketNotEmpty",
    "BucketStore", "KeyTooLong", "LocalStore", "NoSuchBucket", "ObjectInfo", "OwnerChanged",
    "S3Uri", "StorageError", "check_bucket", "check_characters", "check_segments",
    "download_prefix", "local_path", "make_store", "parse_uri", "publish_dir",
    "read_manifest", "regular_files",
]

MANIFEST = "_MANIFEST.json"


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


def make_store(settings: Settings) -> BucketStore:
    """S3 when EAGLENEST_S3_ENDPOINT_URL is set, else the local directory store; either
    with the operator's default account (Settings.account_id)."""
    if settings.s3_endpoint_url:
        # boto3 is imported only where S3 is configured (foundation/store/s3_store.py)
        from eaglenest.foundation.store.s3_store import S3Store

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
