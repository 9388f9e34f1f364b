"""The S3 suite's clients: boto3's s3 client (path-style) for the stack's key and for a key
of a second account (`eaglenest keys create --new-account`), and a bucket per test."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.support.jobs import ROOT
from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack


@dataclass(frozen=True)
class Key:
    access_key: str
    secret: str
    account: str


def s3_client(stack: Stack, key: str = ACCESS_KEY, secret: str = SECRET_KEY,
              **config: Any) -> Any:
    return boto3.client("s3", endpoint_url=stack.url, region_name=REGION,
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"total_max_attempts": 1}, **config))


@pytest.fixture(scope="session")
def s3(stack: Stack) -> Any:
    return s3_client(stack)


@pytest.fixture(scope="session")
def other_key(stack: Stack) -> Key:
    env = {**os.environ, "EAGLENEST_DATA_DIR": str(stack.data_dir)}
    r = subprocess.run([sys.executable, "-m", "eaglenest.cli", "keys", "create",
                        "--name", "s3-other", "--new-account"], env=env, capture_output=True,
                       text=True, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    return Key(out["access key id"], out["secret access key"], out["account"])


@pytest.fixture(scope="session")
def other(stack: Stack, other_key: Key) -> Any:
    """boto3's s3 client for the second account."""
    return s3_client(stack, other_key.access_key, other_key.secret)


@pytest.fixture
def bucket(s3: Any, unique: str) -> str:
    name = unique.lower().replace("_", "-")[-40:].strip("-.")
    s3.create_bucket(Bucket=name)
    return name
