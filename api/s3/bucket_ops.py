"""Bucket operations: ListBuckets (the caller's own buckets only), CreateBucket (claims the
bucket for the caller's account, at most EAGLENEST_MAX_BUCKETS of them: TooManyBuckets),
HeadBucket, DeleteBucket (empty ones, the caller's), GetBucketLocation."""

from __future__ import annotations

from eaglenest.api.s3.body import read_small
from eaglenest.api.s3.errors import S3Error
from eaglenest.api.s3.request import Reply, S3Request, iso_time, node, root, xml_reply
from eaglenest.api.s3.store_access import require_bucket, run
from eaglenest.foundation.store.buckets import BucketTaken


async def list_buckets(req: S3Request) -> Reply:
    mine = await run(req.store.my_buckets)
    out = root("ListAllMyBucketsResult")
    owner = node(out, "Owner")
    node(owner, "ID", req.store.account_id)
    node(owner, "DisplayName", req.store.account_id)
    buckets = node(out, "Buckets")
    for name in sorted(mine):
        el = node(buckets, "Bucket")
        node(el, "Name", name)
        node(el, "CreationDate", iso_time(mine[name]))
    return xml_reply(out)


async def create_bucket(req: S3Request) -> Reply:
    await read_small(req)  # a CreateBucketConfiguration: one region here, nothing to keep
    try:
        await run(req.store.create_bucket, req.bucket, req.settings.max_buckets)
    except BucketTaken as exc:
        if exc.mine:
            raise S3Error("BucketAlreadyOwnedByYou", "Your previous request to create the "
                          "named bucket succeeded and you already own it.",
                          req.resource) from exc
        raise S3Error("BucketAlreadyExists", "The requested bucket name is not available. "
                      "The bucket namespace is shared by all users of the system. Please "
                      "select a different name and try again.", req.resource) from exc
    return Reply(200, headers={"location": f"/{req.bucket}"})


async def head_bucket(req: S3Request) -> Reply:
    await require_bucket(req)
    await run(req.store.check_read, req.bucket)
    return Reply(200, headers={"x-amz-bucket-region": req.settings.region})


async def delete_bucket(req: S3Request) -> Reply:
    await require_bucket(req)
    await run(req.store.delete_bucket, req.bucket)
    return Reply(204)


async def bucket_location(req: S3Request) -> Reply:
    await require_bucket(req)
    await run(req.store.check_read, req.bucket)
    out = root("LocationConstraint")
    region = req.settings.region
    out.text = None if region == "us-east-1" else region
    return xml_reply(out)
