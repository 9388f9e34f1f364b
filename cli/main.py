"""The `eaglenest` command: up, api, worker, migrate, s3, status, bench (+ train,
prepare-target and generate with the `train` extra). Subcommands import what they need (torch
above all) only after their arguments are parsed, so `eaglenest <command> --help` is quick."""

from __future__ import annotations

import argparse
import os
import sys

from eaglenest import __version__
from eaglenest.cli.datadir import add_data_dir_option, settings_for
from eaglenest.cli.parsing import Parser
from eaglenest.foundation.settings import CredentialsError, Settings
from eaglenest.workers.infra.credentials import (
    ensure_credentials,
    loose_credentials,
    private_data_dir,
    usage,
)
from eaglenest.workers.infra.logs import configure_logging


def _settings(args: argparse.Namespace) -> Settings:
    """The commands that create an EagleNest: its data dir is made if missing (0700, files
    0600: docs/security.md)."""
    settings = settings_for(args)
    private_data_dir(settings.data_dir)
    return settings


def _warn_loose_credentials(settings: Settings) -> None:
    warning = loose_credentials(settings)
    if warning:
        print(f"eaglenest: {warning}", file=sys.stderr, flush=True)


def _prepare(settings: Settings) -> None:
    from eaglenest.db.migrate import upgrade_head

    upgrade_head(settings.resolved_database_url())


def _broker(settings: Settings) -> tuple[str, object | None]:
    """The configured broker, or the data dir's embedded one (started if needed)."""
    if settings.broker_url:
        return settings.broker_url, None
    from eaglenest.workers.infra.broker import EmbeddedBroker

    broker = EmbeddedBroker(settings.data_dir)
    url = broker.attach_or_start()
    return url, broker if broker.process else None


#: idle keep-alive connections are kept this long (AWS load balancers: 60 s)
KEEP_ALIVE_SECONDS = 75


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from eaglenest.api.app import create_app
    from eaglenest.foundation.http.connection_limits import Limits
    from eaglenest.foundation.http.connections import uvicorn_options

    settings = _settings(args)
    ensure_credentials(settings)
    _prepare(settings)
    url, broker = _broker(settings)
    if not os.environ.get("EAGLENEST_SUPERVISED"):  # under `up`, up prints it once ready
        print(usage(settings, args.host, args.port), flush=True)
    try:
        # log_config=None: uvicorn's loggers go through the root handler (configure_logging),
        # so EAGLENEST_LOG_FORMAT=json covers them too
        # timeout_keep_alive: idle connections outlive any boto3 waiter's Delay (usually 5 s,
        # uvicorn's default), so a waiter never re-uses a pooled connection just as the
        # server closes it (a connection reset)
        # uvicorn_options: header size, header and body timeouts, connection caps, before
        # any request is authenticated (foundation/http/connections.py)
        uvicorn.run(create_app(settings, url), host=args.host, port=args.port,
                    log_level="warning", access_log=False, log_config=None,
                    timeout_keep_alive=KEEP_ALIVE_SECONDS,
                    **uvicorn_options(Limits.from_settings(settings)))
    finally:
        if broker is not None:
            broker.stop()  # type: ignore[attr-defined]
    return 0


def preload_training_modules() -> bool:
    """Import torch, transformers and models/ in the main thread before any task runs.

    transformers resolves its top-level names lazily, and that lookup is not thread-safe:
    two job threads importing `models.target` at once (a re-delivered job and its
    re-enqueued copy after a worker restart, say) can make one of them fail with
    "cannot import name 'AutoModelForCausalLM' from 'transformers'". Resolving the names
    once here, before the thread pool starts, removes the race. False when the `train`
    extra is not installed (a serve-only worker).
    """
    try:
        import transformers

        import eaglenest.models.target  # noqa: F401
        import eaglenest.models.training.train  # noqa: F401
        import eaglenest.workers.jobs.pipeline  # noqa: F401
    except ImportError:
        return False
    for name in ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer", "DynamicCache"):
        getattr(transformers, name)
    return True


def cmd_worker(args: argparse.Namespace) -> int:
    from eaglenest.workers.app import create_worker_app
    from eaglenest.workers.infra.placement import host_queue

    if args.pool == "prefork" and "serve" in args.queues.split(","):
        # serving processes die with the process that starts them, and a prefork child
        # exits after each task (worker_max_tasks_per_child=1)
        print("eaglenest worker: --pool prefork cannot consume the serve queue (a serving "
              "process dies with the pool process that started it, which exits after each "
              "task); run serve workers with --pool threads", file=sys.stderr)
        return 2
    settings = _settings(args)
    _prepare(settings)
    if "train" in args.queues.split(","):
        preload_training_modules()
    url, broker = _broker(settings)
    app, _ = create_worker_app(settings, url, args.queues)
    # each queue's host twin: what GPU placement hands to this host (workers/infra/placement)
    queues = args.queues.split(",")
    consumed = ",".join([*queues, *(host_queue(q, settings.host_name) for q in queues if q)])
    # JSON logs: no banner (it is not a log line); Celery's own records come through ours
    argv = ["--quiet"] if settings.log_format == "json" else []
    argv += ["worker", "--pool", args.pool, "--concurrency", str(args.concurrency),
            "--queues", consumed, "--loglevel", args.loglevel, "--without-gossip",
            "--without-mingle", "--hostname", f"eaglenest-{os.getpid()}@%h"]
    try:
        app.worker_main(argv)
    finally:
        if broker is not None:
            broker.stop()  # type: ignore[attr-defined]
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from eaglenest.workers.infra.supervisor import run_stack

    settings = _settings(args)
    ensure_credentials(settings)
    _warn_loose_credentials(settings)
    _prepare(settings)
    return run_stack(settings, args.host, args.port)


def cmd_migrate(args: argparse.Namespace) -> int:
    _prepare(_settings(args))
    print("database is at head")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="eaglenest", description=__doc__)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, func, text in (("up", cmd_up, "API + worker on embedded defaults"),
                             ("api", cmd_api, "the API server alone")):
        sp = sub.add_parser(name, help=text, description=text)
        sp.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (0.0.0.0: every interface)")
        sp.add_argument("--port", type=int, default=8080, help="port to listen on")
        add_data_dir_option(sp)
        sp.set_defaults(func=func)
    w = sub.add_parser("worker", help="a Celery worker alone", description="a Celery worker "
                       "alone (`up` starts one; more hosts run more)")
    add_data_dir_option(w)
    w.add_argument("--queues", default="train,serve",
                   help="queues to consume, comma-separated: train (optimization jobs), "
                        "serve (endpoints)")
    w.add_argument("--concurrency", type=int, default=4, help="tasks run at once")
    w.add_argument("--loglevel", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    w.add_argument("--pool", default="threads", choices=["threads", "prefork", "solo"],
                   help="how tasks run: threads, prefork (one process per task: GPU "
                        "training hosts) or solo (one at a time)")
    w.set_defaults(func=cmd_worker)
    m = sub.add_parser("migrate", help="apply database migrations (alembic upgrade head)",
                       description="apply database migrations (alembic upgrade head)")
    add_data_dir_option(m)
    m.set_defaults(func=cmd_migrate)
    from eaglenest.cli import bench, keys, s3, status

    keys.register(sub)
    s3.register(sub)
    bench.register(sub)
    status.register(sub)
    _register_optional(sub)
    return p


#: subcommands implemented in models/ (they import torch): parsed lazily so that `eaglenest
#: api`, `worker` and `s3` start in a fraction of a second
_LAZY = {
    "train": ("eaglenest.models.commands", "train an EAGLE / EAGLE-3 / P-EAGLE draft head"),
    "prepare-target": ("eaglenest.models.commands",
                       "write SmolLM2-135M-Instruct as a model folder"),
    "generate": ("eaglenest.models.decode.generate",
                 "generate text with the embedded speculative engine"),
}


def _register_optional(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name, (module, text) in _LAZY.items():
        sp = sub.add_parser(name, help=text, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(func=_run_lazy, lazy=(name, module))


#: the `train` extra's top-level modules: a command missing one asks for the extra
TRAIN_EXTRA = ("torch", "transformers", "safetensors", "tqdm", "gguf", "matplotlib")


def _run_lazy(args: argparse.Namespace) -> int:
    """Parse with the module's own parser (importing it does not import torch), then run."""
    import importlib

    name, module = args.lazy
    parser = Parser(prog="eaglenest")
    importlib.import_module(module).register(parser.add_subparsers(dest="command",
                                                                   required=True))
    real = parser.parse_args([name, *args.rest])
    try:
        return int(real.func(real) or 0)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in TRAIN_EXTRA:
            raise
        print(f"eaglenest {name} needs the `train` extra: pip install 'EagleNest[train]' "
              f"({exc})", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    configure_logging(Settings().log_format)  # text, or JSON lines (EAGLENEST_LOG_FORMAT)
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in _LAZY:  # hand every argument (--help too) to the real parser
        ns = argparse.Namespace(lazy=(argv[0], _LAZY[argv[0]][0]), rest=argv[1:])
        return _run_lazy(ns)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CredentialsError as exc:  # the operator's file: what to fix, not a traceback
        print(f"eaglenest: error: {exc}", file=sys.stderr)
        return 1

