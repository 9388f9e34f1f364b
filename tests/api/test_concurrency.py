"""Concurrent creates on the default SQLite stack: uniqueness holds, nothing 5xx."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from botocore.exceptions import ClientError

ROLE = "arn:aws:iam::123456789012:role/EagleNestRole"


def test_200_creates_over_50_names_from_8_threads(stack, unique):
    clients = [stack.client() for _ in range(8)]

    def create(i: int) -> str:
        try:
            clients[i % 8].create_model(ModelName=f"{unique}-{i % 50}", ExecutionRoleArn=ROLE,
                                        PrimaryContainer={"Image": "x"})
            return "ok"
        except ClientError as e:
            assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 400, e.response
            return e.response["Error"]["Code"]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(create, range(200)))
    assert results.count("ok") == 50
    assert set(results) == {"ok", "ValidationException"}
    pages = clients[0].get_paginator("list_models").paginate(NameContains=unique)
    assert sorted(m["ModelName"] for p in pages for m in p["Models"]) == \
        sorted(f"{unique}-{i}" for i in range(50))
