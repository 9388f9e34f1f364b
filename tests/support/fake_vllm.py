"""A stand-in for vLLM's OpenAI server with vLLM's command line, for placement tests on a host
without GPUs: `python -m tests.support.fake_vllm <vLLM's arguments>` reads the arguments
vLLM's server takes (--port, --host, --served-model-name, --tensor-parallel-size, --model
...), and serves the routes of tests/support/fake_model_server.py behind the instance's
secret, as vLLM does (a streamed /v1/completions answers as vLLM's does for the benchmark's
load generator: text chunks and, when asked, a usage block). What a test checks is the
command line and environment it was started with (psutil), never what it generates.
Workers run it with EAGLENEST_VLLM_MODULE set to this module (Settings.vllm_module).

Each run is recorded: one JSON line when it starts and one when it exits cleanly on SIGTERM
(after uvicorn's graceful shutdown: uvicorn then raises the signal again, which this
module's handler turns into a return from `uvicorn.run`, exit code 0), {"pid", "event": "start" | "stop", "time": time.time(),
"argv": its arguments}, appended to `RUNS_FILE` in the folder above the one that holds
--model (`runs_file`). A job's benchmark servers get --model <work>/model, and the job's work
folder is removed when the job ends: the record goes one level up, to the account's jobs
folder, where it outlives the job (`<data>/jobs/<account>/fake_vllm_runs.jsonl`); a test
tells its job's runs by their --model (`read_runs`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import uvicorn

from eaglenest.foundation.http.instance_auth import InstanceGuard
from tests.support.fake_model_server import app_for

RUNS_FILE = "fake_vllm_runs.jsonl"


def runs_file(model: str | Path) -> Path:
    """Where the runs of a server started with --model `model` are recorded."""
    return Path(model).resolve().parent.parent / RUNS_FILE


class _Terminated(BaseException):
    """SIGTERM outside uvicorn's own handling: before it serves, or raised again by it once
    its graceful shutdown is done."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def _record(path: Path | None, event: str) -> None:
    if path is None:
        return
    line = json.dumps({"pid": os.getpid(), "event": event, "time": time.time(),
                       "argv": sys.argv[1:]})
    with open(path, "a") as f:  # one write of one short line: appends never interleave
        f.write(line + "\n")


def read_runs(path: Path, model: str | Path | None = None) -> list[dict]:
    """The recorded lines (those whose --model is `model`, when given), in file order."""
    if not path.is_file():
        return []
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    if model is None:
        return lines
    want = str(Path(model).resolve())
    return [x for x in lines if "--model" in x["argv"]
            and str(Path(x["argv"][x["argv"].index("--model") + 1]).resolve()) == want]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", default="model")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--model", default=None)
    args, _ = p.parse_known_args()  # the rest is vLLM's (dtype, speculative config ...)
    record = runs_file(args.model) if args.model else None
    signal.signal(signal.SIGTERM, _terminate)
    _record(record, "start")
    with contextlib.suppress(_Terminated):
        uvicorn.run(InstanceGuard(app_for(args.served_model_name)), host=args.host,
                    port=args.port, log_level="warning")
    _record(record, "stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
