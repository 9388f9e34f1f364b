"""The embedded server:
`python -m eaglenest.workers.model_servers.embedded --model DIR [--head DIR] ...`.

Its arguments mirror vLLM's OpenAI server where they overlap (--model, --port, --host,
--served-model-name, --dtype, --max-model-len) so the process manager treats both alike.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglenest.foundation.host.contention import governor_for
from eaglenest.foundation.host.threads import apply_torch, plan_threads, sharing_from_env
from eaglenest.models.decode.modes import (
    SPECULATIVE_MODES,
    DecodeMode,
    Decoding,
    refusal,
    schedule_refusal,
)

if TYPE_CHECKING:
    from eaglenest.models.heads.registry import HeadSpec
    from eaglenest.workers.model_servers.schedule import Schedule


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eaglenest.workers.model_servers.embedded")
    p.add_argument("--model", required=True)
    p.add_argument("--head", default=None)
    p.add_argument("--mode", default=DecodeMode.CHAIN.value, choices=SPECULATIVE_MODES)
    p.add_argument("--num-speculative-tokens", type=int, default=5)
    p.add_argument("--adaptive", action="store_true")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--max-num-seqs", type=int, default=8,
                   help="requests decoded together (continuous batching); 1 = one at a time")
    p.add_argument("--max-input-length", type=int, default=None,
                   help="the longest prompt in tokens (the container's MAX_INPUT_LENGTH)")
    p.add_argument("--kernel-cache", default=None,
                   help="folder of the linear-kernel timing cache (models/decode/kernel_cache.py)"
                        " shared by this host's servers (default: measure at every start)")
    p.add_argument("--speculation-schedule", default=None,
                   help="K (and decoding) per load, [[max_running, K(, decoding)], ...] "
                        "(workers/model_servers/schedule.py); each step drafts the K for the "
                        "requests running (0 = plain) in the entry's decoding (else --mode)")
    return p


def serving_mode(asked: DecodeMode, head: HeadSpec) -> DecodeMode:
    """The mode to serve ``head`` in: ``asked`` where the head can draft so, else the
    head's own default mode (HeadSpec.default_mode), with a warning that says why.

    Example: chain asked with a block head (DFlash) -> block; block or parallel asked
    with an EAGLE-3 head -> chain."""
    reason = refusal(asked, head)
    if reason is None:
        return asked
    logging.warning("%s; serving in %s mode", reason, head.default_mode.value)
    return head.default_mode


def entry_at_one(schedule: Schedule, head: Any, mode: DecodeMode,
                 kw: dict[str, Any]) -> tuple[Any, DecodeMode]:
    """(head, mode) for a batch-1 engine, which runs one request at a time: the schedule's
    entry at 1 running, its K into ``kw`` (k, depth) and its decoding (mode, adaptive;
    ValueError naming it when the head cannot draft so). Example: [[1, 4, "tree+adaptive"],
    [8, 0]] -> TREE, depth 4, adaptive; [[1, 0], ...] -> no head (the target alone)."""
    k, name = schedule.k_for(1), schedule.decoding_for(1)
    kw.update(k=k or 1, depth=k or 1)
    if not k or head is None:
        return None, mode
    if name is not None:
        from eaglenest.models.heads.registry import head_spec

        reason = schedule_refusal([name], head_spec(head))
        if reason is not None:
            raise ValueError(reason)
        decoding = Decoding.parse(name)
        mode, kw["adaptive"] = decoding.mode, decoding.adaptive
    return head, mode


def build_server(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    import torch

    from eaglenest.models.checkpoint import load_head
    from eaglenest.models.decode.batch import BatchEngine
    from eaglenest.models.decode.engine import DecodeMode, SpeculativeEngine
    from eaglenest.models.decode.kernels import KernelPolicy
    from eaglenest.models.heads.registry import head_spec
    from eaglenest.models.target import load_target
    from eaglenest.workers.model_servers.embedded.server import EmbeddedServer
    from eaglenest.workers.model_servers.schedule import parse_schedule

    schedule = parse_schedule(args.speculation_schedule, "--speculation-schedule") if (
        args.speculation_schedule) else None
    threads = plan_threads(sharing_from_env())
    apply_torch(threads)  # before the first torch op: the inter-op pool is fixed after it
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    target = load_target(args.model, device=device, dtype=getattr(torch, args.dtype))
    head, mode = None, DecodeMode.PLAIN
    if args.head and schedule is not None and not schedule.speculates:
        logging.info("the speculation schedule is off at every load: serving the target alone")
    elif args.head:
        head = load_head(args.head, target.embed_weight(), target.lm_head_weight())
        head = head.to(device=device, dtype=getattr(torch, args.dtype))
        mode = serving_mode(DecodeMode(args.mode), head_spec(head))
    # this process only serves: the kernels chosen for this host replace the linears in
    # place (models/decode/kernels.py; timed at load, float32-exact candidates only)
    kw = dict(k=args.num_speculative_tokens, adaptive=args.adaptive,
              depth=args.num_speculative_tokens,
              kernels=KernelPolicy(in_place=True, cache_dir=Path(args.kernel_cache)
                                   if args.kernel_cache else None))
    layer_types = getattr(target.model.config, "layer_types", None) or []
    engine: SpeculativeEngine
    if args.max_num_seqs > 1 and "linear_attention" not in layer_types:
        engine = BatchEngine(target.model, head, mode, max_num_seqs=args.max_num_seqs,
                             schedule=schedule.thresholds if schedule else None, **kw)
    else:  # recurrent layers cannot drop rejected drafts per row: one request at a time
        if schedule is not None:
            head, mode = entry_at_one(schedule, head, mode, kw)
        engine = SpeculativeEngine(target.model, head, mode, **kw)  # type: ignore[arg-type]
    name = args.served_model_name or args.model
    server = EmbeddedServer(engine, target.tokenizer, name, max_model_len=args.max_model_len,
                            max_input_length=args.max_input_length)
    server.metrics.torch_threads = threads.threads

    def use_threads(n: int) -> None:
        torch.set_num_threads(n)
        server.metrics.torch_threads = n

    governor = governor_for(threads, use_threads)  # others' load on the host, between steps
    server.runner.between_steps = governor.tick if governor is not None else None
    return server


def serve(runner: Any, web: Any) -> int:
    """HTTP on a thread, the engine on this one (the main thread, which loaded the model).

    Why the engine may not run on any other thread: torch's CPU kernels run their parallel
    regions on OpenMP (libgomp), which keeps a pool of worker threads per thread that ever
    started a region. Two such threads in one process (say, the main thread loading the model
    and a second thread decoding) mean more OpenMP workers than CPUs, and libgomp then stops
    its workers spinning between regions: every parallel op pays a futex wake-up, which cost
    the server about a third of its batch-1 speed on 2 cores. So torch runs here only.
    A signal asks uvicorn to stop (a second one forces it); in-flight requests finish first,
    then the engine loop returns. 1 if the HTTP server never started (a port in use).
    """
    def http() -> None:
        try:
            web.run()
        except SystemExit:  # uvicorn's startup failure, logged by it: web.started stays False
            pass
        finally:
            runner.stop()

    def on_signal(signum: int, frame: object) -> None:
        web.force_exit = web.should_exit
        web.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    thread = threading.Thread(target=http, name="http", daemon=True)
    thread.start()
    runner.serve()
    thread.join(timeout=5)
    return 0 if web.started else 1


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from eaglenest.foundation.http.connection_limits import MODEL_SERVER_LIMITS
    from eaglenest.foundation.http.connections import uvicorn_options
    from eaglenest.foundation.http.instance_auth import InstanceGuard
    from eaglenest.workers.model_servers.embedded.server import create_server_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    args = build_parser().parse_args(argv)
    server = build_server(args)
    # every request carries the instance's secret (EAGLENEST_INSTANCE_SECRET, when set);
    # connections are bounded before it is checked (foundation/http/connections.py)
    config = uvicorn.Config(InstanceGuard(create_server_app(server)), host=args.host,
                            port=args.port, log_level="warning", access_log=False,
                            **uvicorn_options(MODEL_SERVER_LIMITS))
    return serve(server.runner, uvicorn.Server(config))


if __name__ == "__main__":
    sys.exit(main())
