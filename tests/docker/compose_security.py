"""The security model holds on the docker compose stack too (scripts/compose_check.sh's
"security" stage; issue #20). The cheapest checks that prove each part, as an attacker
would try them from the host, with the test venv:

    python tests/docker/compose_security.py --project eaglenest \
        -f docker-compose.yml -f docker/compose.ci.yml

  1. an unsigned POST declaring a 1 GiB body gets 403 before any of its body is sent
     (control plane and sagemaker-runtime): the API never waits for the body;
  2. CreateModel with PrimaryContainer.Environment LD_PRELOAD is a ValidationException
     naming the variable, and no model is created;
  3. a key of a second account, made inside the api container with `eaglenest keys create
     --new-account`, cannot describe (or list) the first account's model;
  4. Redis refuses a client without the password (NOAUTH) and, with it, CONFIG and DEBUG;
  5. the API's /metrics (every account's series) answers 401 without the bearer token
     EAGLENEST_METRICS_TOKEN and with a wrong one, even to this loopback client, and 200
     with it.

Exits non-zero (an AssertionError naming the check) on the first failure. Needs
EAGLENEST_ACCESS_KEY_ID / _SECRET_ACCESS_KEY, REDIS_PASSWORD and EAGLENEST_METRICS_TOKEN,
as compose_check.sh exports them.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlparse

import boto3
import httpx
from botocore.config import Config
from botocore.exceptions import ClientError

API = os.environ.get("COMPOSE_CHECK_API", "http://127.0.0.1:8080")
REDIS = os.environ.get("COMPOSE_CHECK_REDIS", "127.0.0.1:6379")
REGION = os.environ.get("EAGLENEST_REGION", "us-east-1")
ROLE = "arn:aws:iam::000000000000:role/EagleNest"
START = time.monotonic()


def say(msg: str) -> None:
    print(f"[security {time.monotonic() - START:5.1f}s] {msg}", flush=True)


def client(key: str, secret: str) -> Any:
    return boto3.client("sagemaker", endpoint_url=API, region_name=REGION,
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(retries={"mode": "standard", "max_attempts": 3}))


def error(call: Any, **kw: Any) -> tuple[str, str]:
    try:
        call(**kw)
    except ClientError as exc:
        return exc.response["Error"]["Code"], exc.response["Error"]["Message"]
    raise AssertionError(f"{call.__name__}({kw}) succeeded")


def unsigned_head(path: str) -> bytes:
    """The status line the API answers to headers declaring a 1 GiB body, none of it sent
    (a server that read the body first would wait, and this would time out)."""
    u = urlparse(API)
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Length: {1 << 30}"
                     f"\r\nX-Amz-Target: SageMaker.ListModels\r\n\r\n".encode())
        reply = b""
        while b"\r\n" not in reply:
            data = sock.recv(4096)
            if not data:
                break
            reply += data
    return reply.split(b"\r\n", 1)[0]


def check_unsigned() -> None:
    for path in ("/", "/endpoints/any/invocations"):
        line = unsigned_head(path)
        assert line.startswith(b"HTTP/1.1 403"), f"unsigned POST {path}: {line!r}"
    say("unsigned POSTs declaring 1 GiB: 403 before the body (control plane, runtime)")


def check_environment(sm: Any) -> None:
    container = {"Image": "eaglenest", "Environment": {"LD_PRELOAD": "/tmp/x.so"},
                 "ModelDataSource": {"S3DataSource": {
                     "S3Uri": "s3://models/tiny/", "S3DataType": "S3Prefix",
                     "CompressionType": "None"}}}
    code, message = error(sm.create_model, ModelName="sec-preload", ExecutionRoleArn=ROLE,
                          PrimaryContainer=container)
    assert code == "ValidationException" and "LD_PRELOAD" in message, (code, message)
    code, _ = error(sm.describe_model, ModelName="sec-preload")
    assert code == "ValidationException", code
    say("Environment LD_PRELOAD: ValidationException naming it, no model created")


def second_account_key(project: str) -> tuple[str, str, str]:
    """(account, key id, secret) of a key made with `eaglenest keys create` in the api
    container (its data dir: the API reads the new key without a restart)."""
    names = subprocess.run(
        ["docker", "ps", "--format", "{{.Names}}",
         "--filter", f"label=com.docker.compose.project={project}",
         "--filter", "label=com.docker.compose.service=api"],
        capture_output=True, text=True, check=True).stdout.split()
    assert len(names) == 1, f"api containers: {names}"
    out = subprocess.run(["docker", "exec", names[0], "eaglenest", "keys", "create",
                          "--name", "compose-bob", "--new-account"],
                         capture_output=True, text=True)
    assert out.returncode == 0, f"keys create: {out.stderr[-1000:]}"
    fields = dict(re.findall(r"^(account|access key id|secret access key): (\S+)$",
                             out.stdout, re.M))
    return fields["account"], fields["access key id"], fields["secret access key"]


def check_accounts(sm: Any, project: str) -> None:
    sm.create_model(ModelName="sec-alice", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": "eaglenest", "ModelDataSource": {"S3DataSource": {
            "S3Uri": "s3://models/tiny/", "S3DataType": "S3Prefix", "CompressionType": "None"}}})
    account, key, secret = second_account_key(project)
    bob = client(key, secret)
    code, message = error(bob.describe_model, ModelName="sec-alice")
    assert (code, message) == ("ValidationException", 'Could not find model "arn:aws:'
                               f'sagemaker:{REGION}:{account}:model/sec-alice".'), message
    assert "sec-alice" not in [m["ModelName"] for m in bob.list_models()["Models"]]
    assert sm.describe_model(ModelName="sec-alice")["ModelName"] == "sec-alice"
    sm.delete_model(ModelName="sec-alice")
    say(f"a key of account {account} (keys create in the api container) does not find "
        "the first account's model")


def redis_replies(*commands: str) -> list[bytes]:
    """One reply line per inline command, on one connection."""
    host, port = REDIS.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall("".join(f"{c}\r\n" for c in commands).encode())
        reply = b""
        while reply.count(b"\r\n") < len(commands):
            data = sock.recv(4096)
            if not data:
                break
            reply += data
    return reply.split(b"\r\n")[:len(commands)]


def check_redis() -> None:
    (ping,) = redis_replies("PING")
    assert ping.startswith(b"-NOAUTH"), f"PING without the password: {ping!r}"
    auth, config, debug = redis_replies(f"AUTH {os.environ['REDIS_PASSWORD']}",
                                        "CONFIG GET dir", "DEBUG SLEEP 0")
    assert auth == b"+OK", auth
    for name, reply in (("CONFIG", config), ("DEBUG", debug)):
        assert reply.startswith(b"-ERR unknown command"), f"{name}: {reply!r}"
    say("redis: NOAUTH without the password; CONFIG and DEBUG unknown with it")


def check_metrics() -> None:
    token = os.environ["EAGLENEST_METRICS_TOKEN"]
    for auth in (None, f"Bearer {token[::-1]}", f"Basic {token}"):
        r = httpx.get(f"{API}/metrics", timeout=10,
                      headers={"Authorization": auth} if auth else {})
        assert (r.status_code, r.headers.get("www-authenticate", "")[:6]) == (401, "Bearer"), (
            f"/metrics with {auth and auth.split()[0]}: {r.status_code} {r.text[:200]}")
        assert "EAGLENEST_METRICS_TOKEN" in r.text and "eaglenest_" not in r.text, r.text
    r = httpx.get(f"{API}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert r.status_code == 200 and "eaglenest_database_up 1.0" in r.text, r.status_code
    say("/metrics: 401 without the bearer token and with a wrong one, 200 with it")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--project", required=True)
    p.add_argument("-f", "--file", action="append", required=True)  # as compose_drive.py
    args = p.parse_args()
    sm = client(os.environ["EAGLENEST_ACCESS_KEY_ID"], os.environ["EAGLENEST_SECRET_ACCESS_KEY"])
    check_unsigned()
    check_environment(sm)
    check_accounts(sm, args.project)
    check_redis()
    check_metrics()
    say("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
