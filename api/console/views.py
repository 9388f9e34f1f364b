"""What each page shows, read from the database for one account: plain dicts for the
templates (which escape every value). Every query names the viewer's account; a name of
another account's resource reads as missing (None), exactly like a name nobody has.

Lists show the account's newest LIST_LIMIT resources of a kind (`more` says when there
are others)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session

from eaglenest.api.console import figures, stages
from eaglenest.db import endpoints_repo, placement_repo
from eaglenest.db.repository import ListQuery, find, list_rows
from eaglenest.db.tables import EndpointRow, ModelRow, OptimizationJobRow
from eaglenest.foundation.accounts import Account, ResourceRef
from eaglenest.foundation.deployment import instances_of

LIST_LIMIT = 100


def _tags(row: Any) -> list[dict[str, str]]:
    return [{"key": str(t.get("Key", "")), "value": str(t.get("Value", ""))}
            for t in (row.tags or []) if isinstance(t, dict)]


def _listed(s: Session, table: Any, account: Account) -> tuple[list[Any], bool]:
    rows, token = list_rows(s, table, ListQuery(max_results=LIST_LIMIT), account.account_id)
    return rows, token is not None


def _model(row: ModelRow) -> dict[str, Any]:
    spec = row.spec or {}
    container = spec.get("PrimaryContainer") or (spec.get("Containers") or [{}])[0] or {}
    source = (container.get("ModelDataSource") or {}).get("S3DataSource") or {}
    env = container.get("Environment") or {}
    return {"name": row.name, "created": row.creation_time, "image": container.get("Image", ""),
            "source": source.get("S3Uri") or container.get("ModelDataUrl", ""),
            "channels": [str(c.get("ChannelName", "")) for c in
                         container.get("AdditionalModelDataSources") or []],
            "backend": env.get("EAGLENEST_SERVING_BACKEND", ""), "tags": _tags(row)}


def models(s: Session, account: Account) -> dict[str, Any]:
    rows, more = _listed(s, ModelRow, account)
    return {"models": [_model(r) for r in rows], "more": more}


def _stage_text(progress: dict[str, Any]) -> str:
    """The current stage's counters in a few words."""
    p = progress
    if p.get("phase") == "starting":
        return f"starting the {p.get('row', '')} server ({p.get('server')}/{p.get('servers')})"
    if "phase" in p:
        return (f"concurrency {p.get('level')}: {p.get('row', '')}, round {p.get('round')}/"
                f"{p.get('rounds')}, requests {p.get('requests')}/{p.get('requests_total')}")
    if "shard" in p:
        return f"shard {p.get('shard')}/{p.get('shards')}, samples {p.get('samples')}"
    if "step" in p:
        loss = p.get("loss")
        loss_text = f", loss {loss:.3f}" if isinstance(loss, int | float) else ""
        return f"step {p.get('step')}/{p.get('total')}{loss_text}"
    return ""


def _job_summary(row: OptimizationJobRow) -> dict[str, Any]:
    progress = row.progress if isinstance(row.progress, dict) else {}
    return {"name": row.name, "status": row.status, "created": row.creation_time,
            "started": row.start_time, "ended": row.end_time,
            "stage": str(progress.get("stage", "")) if row.status in stages.ACTIVE else "",
            "overall": stages.overall(row.status, progress),
            "failure": row.failure_reason or "", "tags": _tags(row)}


def jobs(s: Session, account: Account) -> dict[str, Any]:
    rows, more = _listed(s, OptimizationJobRow, account)
    return {"jobs": [_job_summary(r) for r in rows], "more": more}


def job(s: Session, account: Account, name: str) -> dict[str, Any] | None:
    row = find(s, OptimizationJobRow, name, account_id=account.account_id)
    if row is None:
        return None
    spec, output = row.spec or {}, row.output if isinstance(row.output, dict) else {}
    progress = row.progress if isinstance(row.progress, dict) else {}
    source = spec.get("ModelSource") or {}
    out_cfg = spec.get("OutputConfig") or {}
    return {**_job_summary(row),
            "source": (source.get("S3") or {}).get("S3Uri")
            or (source.get("SageMakerModel") or {}).get("ModelName", ""),
            "instance_type": spec.get("DeploymentInstanceType", ""),
            "output_location": out_cfg.get("S3OutputLocation", ""),
            "output_model": (out_cfg.get("SageMakerModel") or {}).get("ModelName", ""),
            "artifacts": output.get("ArtifactUri", ""),
            "bars": stages.bars(row.status, progress,
                                ("benchmark",) if output.get("Benchmark") else ()),
            "detail": _stage_text(progress) if row.status in stages.ACTIVE else "",
            "can_stop": row.status in ("STARTING", "INPROGRESS"),
            "active": row.status in stages.ACTIVE,
            "curve": figures.training(progress),
            "benchmark": figures.benchmark(output.get("Benchmark"))}


def endpoints(s: Session, account: Account) -> dict[str, Any]:
    rows, more = _listed(s, EndpointRow, account)
    return {"endpoints": [
        {"name": r.name, "status": r.status, "config": r.config_name,
         "created": r.creation_time, "modified": r.last_modified_time,
         "variants": len((r.deployment or {}).get("ProductionVariants") or []),
         "failure": r.failure_reason or "", "tags": _tags(r)} for r in rows], "more": more}


def _variants(s: Session, row: EndpointRow) -> list[dict[str, Any]]:
    """The config's variants with what the deployment record says serves each."""
    config = endpoints_repo.config_spec(s, row) or {}
    deployment = row.deployment or {}
    summaries = {v.get("VariantName"): v for v in deployment.get("ProductionVariants") or []}
    servers = deployment.get("Servers") or {}
    listed = config.get("ProductionVariants") or [{"VariantName": n} for n in summaries]
    out = []
    for v in listed:
        name = v.get("VariantName", "")
        summary, record = summaries.get(name) or {}, servers.get(name) or {}
        instances = [{"host": i.get("host") or "-",
                      "gpus": ", ".join(str(g) for g in i.get("gpus") or []) or "none (CPU)",
                      "unit": i.get("unit") or "-", "pid": i.get("pid") or "-"}
                     for i in (instances_of(record) if record else [])]
        out.append({"name": name, "model": v.get("ModelName", ""),
                    "instance_type": v.get("InstanceType", ""),
                    "weight": summary.get("CurrentWeight", v.get("InitialVariantWeight", 1)),
                    "current": summary.get("CurrentInstanceCount", 0),
                    "desired": summary.get("DesiredInstanceCount",
                                           v.get("InitialInstanceCount", 0)),
                    "image": record.get("resolved_image") or record.get("backend") or "",
                    "instances": instances})
    return out


def endpoint(s: Session, account: Account, name: str) -> dict[str, Any] | None:
    row = find(s, EndpointRow, name, account_id=account.account_id)
    if row is None:
        return None
    variants = _variants(s, row)
    metrics = figures.endpoint_metrics(s, account.account_id, row.name,
                                       [v["name"] for v in variants], time.time())
    return {"name": row.name, "status": row.status, "config": row.config_name,
            "pending": row.pending_config_name or "", "created": row.creation_time,
            "modified": row.last_modified_time, "failure": row.failure_reason or "",
            "tags": _tags(row), "variants": variants, "metrics": metrics,
            "can_delete": row.status != endpoints_repo.DELETING}


def endpoint_brief(s: Session, account: Account, name: str) -> dict[str, Any] | None:
    """The endpoint's name and status (the delete confirmation's page)."""
    row = find(s, EndpointRow, name, account_id=account.account_id)
    return None if row is None else {"name": row.name, "status": row.status}


OTHERS = "another account"


def _holder(arn: str, account: Account) -> tuple[str, str]:
    """What a GPU's holder is called on this account's page, and its page: its own
    resources by kind and name, any other account's as OTHERS (never its name)."""
    ref = ResourceRef.parse(arn)
    if ref is None or ref.account_id != account.account_id:
        return OTHERS, ""
    kind = arn.split(":", 5)[5].split("/", 1)[0]
    if kind == "optimization-job":
        return f"job {ref.name}", f"/console/jobs/{ref.name}"
    return f"{kind} {ref.name}", f"/console/endpoints/{ref.name}" if kind == "endpoint" else ""


def hosts(s: Session, account: Account, lease_seconds: float) -> dict[str, Any]:
    held = {(h.host, h.gpu_index): h for h in placement_repo.holdings(s)}
    by_host: dict[str, dict[str, Any]] = {}
    for w in placement_repo.live_workers(s, lease_seconds):
        host = by_host.setdefault(w.host, {"name": w.host, "workers": 0, "queues": set(),
                                           "gpus": {}})
        host["workers"] += 1
        host["queues"].update(q for q in w.queues.split(",") if q)
        for g in w.gpus or []:
            host["gpus"][int(g["index"])] = g
    out = []
    for host in sorted(by_host.values(), key=lambda h: h["name"]):
        gpus = []
        for index, g in sorted(host["gpus"].items()):
            holding = held.get((host["name"], index))
            holder, href = _holder(holding.holder, account) if holding else ("", "")
            gpus.append({"index": index, "name": g.get("name", ""),
                         "memory_gib": g.get("memory_gib", 0), "holder": holder, "href": href,
                         "unit": holding.unit if holding and holder != OTHERS else "",
                         "since": holding.since if holding else None})
        out.append({"name": host["name"], "workers": host["workers"],
                    "queues": ", ".join(sorted(host["queues"])), "gpus": gpus,
                    "held": sum(1 for g in gpus if g["holder"])})
    return {"hosts": out}
