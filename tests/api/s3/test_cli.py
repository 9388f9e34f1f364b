"""The AWS CLI's `aws s3` (unmodified but for --endpoint-url) against a running stack: mb,
cp up and down (a 20 MiB file goes up in multipart, the CLI's threshold set to 5 MiB in
its config file), ls, rm, rb; and `eaglenest s3 cp s3://b/k -` to stdout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.jobs import ROOT
from tests.support.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack


def aws_s3(stack: Stack, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp / "aws-config"
    config.write_text(f"[default]\nregion = {REGION}\ns3 =\n  multipart_threshold = 5MB\n"
                      "  multipart_chunksize = 5MB\n  addressing_style = path\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_CONFIG_FILE=str(config), AWS_MAX_ATTEMPTS="1")
    exe = shutil.which("aws")
    cmd = [exe] if exe else [sys.executable, "-m", "awscli"]
    return subprocess.run([*cmd, "s3", *args, "--endpoint-url", stack.url], env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_mb_cp_ls_rm(stack: Stack, s3: Any, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(20 * 1024 * 1024 + 123))
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "a.txt").write_text("a")
    (tmp_path / "tree" / "sub" / "b.txt").write_text("b")
    steps = [("mb", "s3://cli-bucket"),
             ("cp", str(big), "s3://cli-bucket/data/big.bin"),
             ("cp", "--recursive", str(tmp_path / "tree"), "s3://cli-bucket/tree/")]
    for step in steps:
        r = aws_s3(stack, tmp_path, *step)
        assert r.returncode == 0, (step, r.stderr)
    uploads = stack.data_dir / "s3-uploads" / "multipart"
    assert uploads.is_dir() and not [p for p in uploads.rglob("*") if p.is_file()]  # in parts
    head = s3.head_object(Bucket="cli-bucket", Key="data/big.bin")
    assert head["ContentLength"] == big.stat().st_size
    r = aws_s3(stack, tmp_path, "ls", "s3://cli-bucket/")
    assert r.returncode == 0, r.stderr
    assert "PRE data/" in r.stdout and "PRE tree/" in r.stdout
    r = aws_s3(stack, tmp_path, "ls", "--recursive", "s3://cli-bucket/tree/")
    assert [line.split()[-1] for line in r.stdout.splitlines()] == ["tree/a.txt",
                                                                    "tree/sub/b.txt"]
    down = tmp_path / "down.bin"
    r = aws_s3(stack, tmp_path, "cp", "s3://cli-bucket/data/big.bin", str(down))
    assert r.returncode == 0, r.stderr
    assert down.read_bytes() == big.read_bytes()
    r = aws_s3(stack, tmp_path, "cp", "s3://cli-bucket/tree/a.txt", "-")
    assert (r.returncode, r.stdout) == (0, "a")
    r = aws_s3(stack, tmp_path, "ls")
    assert "cli-bucket" in r.stdout
    r = aws_s3(stack, tmp_path, "rb", "s3://cli-bucket")
    assert r.returncode != 0 and "BucketNotEmpty" in r.stderr
    for step in (("rm", "--recursive", "s3://cli-bucket/"), ("rb", "s3://cli-bucket")):
        r = aws_s3(stack, tmp_path, *step)
        assert r.returncode == 0, (step, r.stderr)
    assert "cli-bucket" not in aws_s3(stack, tmp_path, "ls").stdout


def test_cli_errors(stack: Stack, tmp_path: Path) -> None:
    r = aws_s3(stack, tmp_path, "ls", "s3://no-such-bucket-cli/")
    assert r.returncode != 0 and "NoSuchBucket" in r.stderr
    r = aws_s3(stack, tmp_path, "cp", "s3://no-such-bucket-cli/k", str(tmp_path / "x"))
    assert r.returncode != 0 and "404" in r.stderr


def test_eaglenest_s3_cp_to_stdout(stack: Stack, s3: Any, bucket: str,
                                   tmp_path: Path) -> None:
    body = os.urandom(3 * 1024 * 1024)
    s3.put_object(Bucket=bucket, Key="blob", Body=body)
    env = stack.env()  # the stack's data dir and account
    cli = [sys.executable, "-m", "eaglenest.cli", "s3", "cp"]
    r = subprocess.run([*cli, f"s3://{bucket}/blob", "-"], env=env, capture_output=True,
                       cwd=ROOT, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == body
    assert not (tmp_path / "-").exists() and not (ROOT / "-").exists()
    r = subprocess.run([*cli, "-", f"s3://{bucket}/from-stdin"], env=env, input=b"piped",
                       capture_output=True, cwd=ROOT, check=False, timeout=60)
    assert r.returncode == 0, r.stderr
    assert s3.get_object(Bucket=bucket, Key="from-stdin")["Body"].read() == b"piped"
    r = subprocess.run([*cli, f"s3://{bucket}/missing", "-"], env=env, capture_output=True,
                       cwd=ROOT, check=False, timeout=60)
    assert r.returncode == 1 and b"does not exist" in r.stderr
