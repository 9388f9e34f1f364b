"""The artifact store over real S3 (boto3, any endpoint_url: AWS, MinIO, moto_server): the
`BucketStore` interface of foundation/store/storage.py, which builds it (`make_store`) when
EAGLENEST_S3_ENDPOINT_URL is set."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

from eaglenest.foundation.store.store_base import (
    OWNER_KEY,
    RESERVED_PREFIX,
    BucketNotEmpty,
    NoSuchBucket,
    ObjectInfo,
    OwnerChanged,
    S3Uri,
    StorageError,
    check_bucket,
)


def _code(exc: Exception) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


_MISSING = ("NoSuchKey", "404", "NoSuchBucket", "NotFound")


class S3Store:
    """Real S3. The owner of a bucket is its object `.eaglenest/owner`, written with
    `If-None-Match: *` (a conditional write: AWS S3, MinIO) so that only the first claim
    creates it; listings leave it out and `parse_uri` refuses its key."""

    def __init__(self, endpoint_url: str | None, region: str,
                 default_account: str | None = None, **client_kw: Any) -> None:
        import boto3

        self.default_account = default_account
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region,
                                   **client_kw)

    def owner(self, bucket: str) -> str | None:
        try:
            obj = self.client.get_object(Bucket=check_bucket(bucket), Key=OWNER_KEY)
        except Exception as exc:
            if _code(exc) in _MISSING:
                return None
            raise
        return bytes(obj["Body"].read()).decode().strip() or None

    def claim(self, bucket: str, account_id: str) -> str:
        for _ in range(5):  # 409: a concurrent conditional write was in flight; ask again
            try:
                self.client.put_object(Bucket=check_bucket(bucket), Key=OWNER_KEY,
                                       Body=account_id.encode(), IfNoneMatch="*")
            except Exception as exc:
                if _code(exc) == "NoSuchBucket":
                    raise StorageError(f"s3://{bucket}/ does not exist") from exc
                if _code(exc) not in ("PreconditionFailed", "412",
                                      "ConditionalRequestConflict", "409"):
                    raise
            owner = self.owner(bucket)
            if owner is not None:
                return owner
        raise StorageError(f"s3://{bucket}/: could not record the bucket's owner")

    def assign(self, bucket: str, account_id: str) -> None:
        try:
            self.client.put_object(Bucket=check_bucket(bucket), Key=OWNER_KEY,
                                   Body=account_id.encode())
        except Exception as exc:
            if _code(exc) == "NoSuchBucket":
                raise StorageError(f"s3://{bucket}/ does not exist") from exc
            raise

    def release(self, bucket: str) -> None:
        try:
            self.client.delete_object(Bucket=check_bucket(bucket), Key=OWNER_KEY)
        except Exception as exc:
            if _code(exc) not in _MISSING:
                raise

    def _missing(self, exc: Exception, uri: S3Uri) -> Exception:
        if _code(exc) in _MISSING:
            return StorageError(f"{uri} does not exist")
        return exc

    def put_bytes(self, uri: S3Uri, data: bytes) -> None:
        self.client.put_object(Bucket=uri.bucket, Key=uri.key, Body=data)

    def get_bytes(self, uri: S3Uri) -> bytes:
        try:
            body: bytes = self.client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].read()
        except Exception as exc:
            raise self._missing(exc, uri) from exc
        return body

    def _listed(self, prefix: S3Uri) -> list[dict[str, Any]]:
        """ListObjectsV2's entries under `prefix`, every page, but the store's own records
        (RESERVED_PREFIX); a missing bucket is a StorageError."""
        found: list[dict[str, Any]] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=prefix.bucket, Prefix=prefix.key)
            for page in pages:
                found += [o for o in page.get("Contents", [])
                          if not o["Key"].startswith(RESERVED_PREFIX)]
        except Exception as exc:
            raise self._missing(exc, prefix) from exc
        return found

    def list_keys(self, prefix: S3Uri) -> list[str]:
        return sorted(o["Key"] for o in self._listed(prefix))

    def put_file(self, uri: S3Uri, path: Path) -> None:
        self.client.upload_file(str(path), uri.bucket, uri.key)

    def get_file(self, uri: S3Uri, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.client.download_file(uri.bucket, uri.key, str(path))
        except Exception as exc:
            raise self._missing(exc, uri) from exc

    def delete(self, uri: S3Uri) -> None:
        self.client.delete_object(Bucket=uri.bucket, Key=uri.key)

    def stat(self, uri: S3Uri) -> ObjectInfo | None:
        try:
            head = self.client.head_object(Bucket=uri.bucket, Key=uri.key)
        except Exception as exc:
            if _code(exc) in _MISSING:
                return None
            raise
        return ObjectInfo(uri.key, int(head["ContentLength"]),
                          head["LastModified"].timestamp(), str(head["ETag"]))

    def list_objects(self, prefix: S3Uri) -> list[ObjectInfo]:
        found = [ObjectInfo(o["Key"], int(o["Size"]), o["LastModified"].timestamp(),
                            str(o["ETag"])) for o in self._listed(prefix)]
        return sorted(found, key=lambda o: o.key)

    def open_object(self, uri: S3Uri, start: int = 0, end: int | None = None) -> BinaryIO:
        extra = {"Range": f"bytes={start}-{'' if end is None else end}"} if start or \
            end is not None else {}
        try:
            body: BinaryIO = self.client.get_object(Bucket=uri.bucket, Key=uri.key,
                                                    **extra)["Body"]
        except Exception as exc:
            raise self._missing(exc, uri) from exc
        return body

    def adopt_file(self, uri: S3Uri, path: Path, owner: str | None = None) -> None:
        """With `owner`: its record is read just before the upload (S3 has no lock to
        hold across it: a bucket re-created in between is not caught)."""
        if owner is not None:
            current = self.owner(uri.bucket)
            if current != owner:
                if current is None and not self.bucket_exists(uri.bucket):
                    raise NoSuchBucket(uri.bucket)
                raise OwnerChanged(uri.bucket, owner)
        self.put_file(uri, path)
        path.unlink()

    def buckets(self) -> dict[str, float]:
        return {b["Name"]: b["CreationDate"].timestamp()
                for b in self.client.list_buckets().get("Buckets", [])}

    def buckets_of(self, account_id: str) -> dict[str, float]:
        """Every bucket's owner record is read (S3 keeps no index of them)."""
        return {name: created for name, created in self.buckets().items()
                if self.owner(name) == account_id}

    def bucket_exists(self, bucket: str) -> bool:
        try:
            self.client.head_bucket(Bucket=check_bucket(bucket))
        except Exception as exc:
            if _code(exc) in _MISSING:
                return False
            raise
        return True

    def create_bucket(self, bucket: str) -> None:
        try:
            self.client.create_bucket(Bucket=check_bucket(bucket))
        except Exception as exc:
            if _code(exc) != "BucketAlreadyOwnedByYou":
                raise

    def delete_bucket(self, bucket: str) -> None:
        if self.list_keys(S3Uri(check_bucket(bucket), "")):
            raise BucketNotEmpty(f"s3://{bucket}/ is not empty")
        self.release(bucket)
        self.client.delete_bucket(Bucket=bucket)
