"""`eaglenest status`: jobs, endpoints, GPU hosts (each GPU and what holds it), workers
and queues at a glance; under each endpoint, the backend serving each variant (its resolved
image); under each running job its stage and, while it trains, its progress (step/total,
loss, training accuracy, tokens/s, ETA), while it benchmarks, which server starts or which
level, row and round it measures (requests done/total, ETA), as its worker last recorded
them (workers/jobs/progress.py); under a job or endpoint, the variables of its request that
EagleNest ignores (foundation/environment.py).

The database and broker clients are imported when the command runs, not when the `eaglenest`
parser is built (`eaglenest <command> --help` stays quick)."""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, datetime
from typing import Any

from eaglenest.cli.datadir import add_data_dir_option, require_eaglenest, settings_for
from eaglenest.foundation.environment import ignored_warning
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.broker import embedded_url
from eaglenest.workers.jobs.progress import describe, format_duration


def _broker_url(settings: Settings) -> str | None:
    if settings.broker_url:
        return settings.broker_url
    return embedded_url(settings.data_dir)


def _shown(url: str) -> str:
    """The URL without its password (status output is shared in tickets and chats)."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _row_line(r: Any) -> str:
    extra = f"  owner {r.owner}" if getattr(r, "owner", None) else ""
    reason = f"  ({r.failure_reason[:80]})" if r.failure_reason else ""
    return f"  {r.name:<40} {r.status:<14} {_when(r.last_modified_time)}{extra}{reason}"


def progress_line(progress: dict[str, Any] | None, now: float) -> str | None:
    """`    <stage>: <step, loss, ...>  (updated 8s ago)`, or None without a record."""
    if not progress or not progress.get("stage"):
        return None
    figures = describe(progress)
    ago = format_duration(now - float(progress.get("updated", now)))
    return f"    {progress['stage']}{': ' + figures if figures else ''}  (updated {ago} ago)"


def ignored_lines(s: Any, row: Any) -> list[str]:
    """`    ignores ... variables ...` under a job or endpoint whose request holds variables
    EagleNest accepts but passes to no process (foundation/environment.py)."""
    from eaglenest.db.tables import EndpointRow

    if isinstance(row, EndpointRow):
        notes = [ignored_warning(env, "Environment", f"model {model}")
                 for model, env in _model_environments(s, row)]
    else:
        notes = [ignored_warning(row.spec.get("OptimizationEnvironment"),
                                 "OptimizationEnvironment")]
    return [f"    {note}" for note in notes if note]


def _model_environments(s: Any, endpoint: Any) -> list[tuple[str, dict[str, str]]]:
    """(model, its serving container's Environment) of each model of the endpoint's
    config, as the endpoint's account sees them."""
    from eaglenest.db.repository import find
    from eaglenest.db.tables import EndpointConfigRow, ModelRow

    config = find(s, EndpointConfigRow, endpoint.config_name, account_id=endpoint.account_id)
    variants = (config.spec.get("ProductionVariants") or []) if config else []
    out = []
    for name in dict.fromkeys(str(v.get("ModelName")) for v in variants if v.get("ModelName")):
        model = find(s, ModelRow, name, account_id=endpoint.account_id)
        if model is None:
            continue
        spec = model.spec
        container = spec.get("PrimaryContainer") or (spec.get("Containers") or [{}])[0]
        out.append((name, dict(container.get("Environment") or {})))
    return out


def host_lines(s: Any, lease_seconds: float) -> list[str]:
    """`hosts:`, then per host its live workers and each GPU with what holds it."""
    from eaglenest.db import placement_repo
    from eaglenest.foundation.accounts import ResourceRef

    workers = placement_repo.live_workers(s, lease_seconds)
    held = {(h.host, h.gpu_index): h for h in placement_repo.holdings(s)}
    hosts = sorted({w.host for w in workers})
    out = [f"hosts: {len(hosts) or 'none'}"]
    for host in hosts:
        mine = [w for w in workers if w.host == host]
        gpus = {int(g["index"]): g for w in mine for g in w.gpus}
        names = ", ".join(f"{w.owner} ({w.queues})" for w in mine)
        out.append(f"  {host}: {len(gpus)} GPU(s); workers {names}")
        for index, g in sorted(gpus.items()):
            h = held.get((host, index))
            ref = ResourceRef.parse(h.holder) if h else None
            what = (f"{h.holder.split(':')[-1]} ({ref.account_id if ref else '?'}) {h.unit}"
                    if h else "free")
            out.append(f"    GPU {index} {g['name']} {g['memory_gib']:g} GiB: {what}")
    return out


def variant_lines(endpoint: Any) -> list[str]:
    """`    variant <name>: <resolved image> (Image <specified>), <n> instance(s)` per variant
    the endpoint's deployment record lists: which backend serves it
    (foundation/deployment.py)."""
    from eaglenest.foundation.deployment import deployed_images, instances_of

    out = []
    for name, record in ((endpoint.deployment or {}).get("Servers") or {}).items():
        image = (deployed_images(record) or [{}])[0]
        specified = f" (Image {image['SpecifiedImage']})" if "SpecifiedImage" in image else ""
        count = len(instances_of(record))
        out.append(f"    variant {name}: {image.get('ResolvedImage', 'backend unknown')}"
                   f"{specified}, {count} instance{'s' if count != 1 else ''}")
    return out


def _rows(s: Any, table: Any) -> list[Any]:
    """The ten last modified rows, and for jobs every running one besides."""
    from sqlalchemy import select

    from eaglenest.db.optimization_jobs_repo import ACTIVE
    from eaglenest.db.tables import OptimizationJobRow

    recent = list(s.scalars(select(table).order_by(table.last_modified_time.desc()).limit(10)))
    if table is OptimizationJobRow:
        shown = {r.id for r in recent}  # not names: two accounts may use one
        running = s.scalars(select(table).where(table.status.in_(ACTIVE))
                            .order_by(table.last_modified_time.desc()))
        recent += [r for r in running if r.id not in shown]
    return recent


def _database(settings: Settings) -> tuple[list[str], bool]:
    """The summary lines, and whether the database could be read."""
    from sqlalchemy import func, select

    from eaglenest.db.optimization_jobs_repo import ACTIVE
    from eaglenest.db.session import Database
    from eaglenest.db.tables import EndpointRow, OptimizationJobRow

    db = Database(settings.resolved_database_url())
    out: list[str] = []
    ok = True
    try:
        with db.session() as s:
            tables: list[tuple[Any, str]] = [(OptimizationJobRow, "jobs"),
                                             (EndpointRow, "endpoints")]
            for table, label in tables:
                counts: dict[str, int] = dict(s.execute(select(table.status, func.count())
                                        .group_by(table.status)).all())
                summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
                out.append(f"{label}: {summary}")
                for r in _rows(s, table):
                    out.append(_row_line(r))
                    running = table is OptimizationJobRow and r.status in ACTIVE
                    line = progress_line(r.progress, time.time()) if running else None
                    out += [line] if line else []
                    out += ignored_lines(s, r)
                    out += variant_lines(r) if table is EndpointRow else []
            out += host_lines(s, settings.job_lease_seconds)
    except Exception as exc:
        out.append(f"database: unreachable ({exc.__class__.__name__}: {exc})"[:200])
        ok = False
    finally:
        db.dispose()
    return out, ok


def _broker(settings: Settings) -> list[str]:
    url = _broker_url(settings)
    if url is None:
        return ["broker: not configured and no embedded broker running"]
    import redis
    from celery import Celery

    from eaglenest.foundation.queue import SERVE_QUEUE, TRAIN_QUEUE

    try:
        r = redis.Redis.from_url(url, socket_timeout=2)
        queues = ", ".join(f"{q} {r.llen(q)} waiting" for q in (TRAIN_QUEUE, SERVE_QUEUE))
    except redis.RedisError as exc:
        return [f"broker: unreachable at {_shown(url)} ({exc})"]
    app = Celery("eaglenest-status", broker=url, set_as_current=False)
    replies: list[dict[str, Any]] = app.control.ping(timeout=1.5) or []
    workers = ", ".join(sorted(name for reply in replies for name in reply)) or "none answering"
    return [f"broker: {_shown(url)}", f"queues: {queues}", f"workers: {workers}"]


def cmd_status(args: argparse.Namespace) -> int:
    """1 when the database cannot be read (nothing is created to read it)."""
    settings = settings_for(args)
    require_eaglenest(settings, "status")
    lines, ok = _database(settings)
    print("\n".join([f"data dir: {settings.data_dir}", *lines, *_broker(settings)]))
    return 0 if ok else 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="jobs, endpoints, workers and queues at a glance",
                       description="jobs (running ones with their stage and progress), "
                                   "endpoints, workers and queues at a glance")
    add_data_dir_option(p)
    p.set_defaults(func=cmd_status)
