"""`eaglenest status`: jobs, endpoints, workers and queues at a glance."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from eaglenest.db.session import Database
from eaglenest.db.tables import EndpointRow, OptimizationJobRow
from eaglenest.foundation.queue import SERVE_QUEUE, TRAIN_QUEUE
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.broker import embedded_url


def _broker_url(settings: Settings) -> str | None:
    if settings.broker_url:
        return settings.broker_url
    return embedded_url(settings.data_dir)


def _shown(url: str) -> str:
    """The URL without its password (status output is shared in tickets and chats)."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _database(settings: Settings) -> list[str]:
    db = Database(settings.resolved_database_url())
    out: list[str] = []
    try:
        with db.session() as s:
            tables: list[tuple[Any, str]] = [(OptimizationJobRow, "jobs"),
                                             (EndpointRow, "endpoints")]
            for table, label in tables:
                counts: dict[str, int] = dict(s.execute(select(table.status, func.count())
                                        .group_by(table.status)).all())
                summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
                out.append(f"{label}: {summary}")
                recent = s.scalars(select(table).order_by(table.last_modified_time.desc())
                                   .limit(10))
                for r in recent:
                    extra = f"  owner {r.owner}" if getattr(r, "owner", None) else ""
                    reason = f"  ({r.failure_reason[:80]})" if r.failure_reason else ""
                    out.append(f"  {r.name:<40} {r.status:<14} {_when(r.last_modified_time)}"
                               f"{extra}{reason}")
    except Exception as exc:
        out.append(f"database: unreachable ({exc.__class__.__name__}: {exc})"[:200])
    finally:
        db.dispose()
    return out


def _broker(settings: Settings) -> list[str]:
    url = _broker_url(settings)
    if url is None:
        return ["broker: not configured and no embedded broker running"]
    import redis
    from celery import Celery

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
    from pathlib import Path

    settings = Settings()
    if args.data_dir:
        settings = settings.model_copy(update={"data_dir": Path(args.data_dir)})
    print("\n".join(_database(settings) + _broker(settings)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("status", help="jobs, endpoints, workers and queues at a glance")
    p.add_argument("--data-dir", default=None)
    p.set_defaults(func=cmd_status)
