"""A stand-in for vLLM's OpenAI server with vLLM's command line, for placement tests on a host
without GPUs: `python -m tests.support.fake_vllm <vLLM's arguments>` reads the arguments
vLLM's server takes (--port, --host, --served-model-name, --tensor-parallel-size ...), and
serves the routes of tests/support/fake_model_server.py behind the instance's secret, as
vLLM does. What a test checks is the command line and environment it was started with
(psutil), never what it generates. Workers run it with EAGLENEST_VLLM_MODULE set to this
module (Settings.vllm_module)."""

from __future__ import annotations

import argparse
import sys

import uvicorn

from eaglenest.foundation.instance_auth import InstanceGuard
from tests.support.fake_model_server import app_for


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", default="model")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    args, _ = p.parse_known_args()  # the rest is vLLM's (model, dtype, speculative config)
    uvicorn.run(InstanceGuard(app_for(args.served_model_name)), host=args.host,
                port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
