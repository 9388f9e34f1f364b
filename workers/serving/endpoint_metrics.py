"""The served variants' figures in the metric store, sampled by the worker that started
their model servers, about once a minute (`EndpointSampler`, owned by the worker's
`ProcessMetrics`: workers/infra/metrics.py; workers/app.py gives it one on a serve worker).

Each sample reads every endpoint row's deployment (db: `Servers`, variant -> record with its
`instances`, foundation/deployment.py) and takes the instances whose process record names
this very process as its owner (foundation/host/children.py `myself`) and still runs: each
instance is sampled by exactly one worker, and a stopped or deleted endpoint's instances are
sampled no more (they left the row, and their processes are gone). The endpoint's account
owns the data; dimensions (EndpointName, VariantName), the names as created.

- "EagleNest/Endpoints", from the model server's own /metrics page (vLLM's names, which the
  embedded engine writes too: workers/model_servers/embedded/metrics.py), as differences
  between two samples of the same instance (the first from zero at the instance's first
  /health answer; a counter that went down means a new process: that sample is skipped):
  OutputTokensPerSecond (Count/Second, vllm:generation_tokens_total over the seconds
  between), DraftTokens and AcceptedDraftTokens (Count, vllm:spec_decode_num_draft_tokens /
  _accepted_tokens_total), AcceptedTokensPerRound (None: tau = accepted / drafts + 1, only
  when a round was drafted), SpeculationK (None: the K in force, `k_in_force`). A split
  instance's page is its speculating server's (workers/model_servers/split_router.py): the
  tokens its plain server generates are not counted.
- "/aws/sagemaker/Endpoints", the instance's process tree (psutil, workers/infra/metrics.py
  `TreeUsage`): CPUUtilization (Percent, 100 per busy core, since the previous sample),
  MemoryUtilization (Percent of the host's memory, resident); GPUUtilization and
  GPUMemoryUtilization (Percent, summed over the instance's GPUs as SageMaker does: up to
  100 x GPUs) only where NVML reads every one of them.
- "AWS/SageMaker" ModelSetupTime (Microseconds): once per instance started, its launch to
  its first /health answer (workers/model_servers/process.py `ServerProcess.setup_seconds`,
  kept in the instance's record), at the time of that answer.
Each instance is one sample of its variant's series: a minute's Average is per instance, its
Sum the variant's.
"""

from __future__ import annotations

import hmac
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from eaglenest.db.metrics_repo import Datum
from eaglenest.db.tables import EndpointRow
from eaglenest.foundation.deployment import instances_of
from eaglenest.foundation.host import children
from eaglenest.foundation.host.loops import Loop
from eaglenest.foundation.http import instance_auth
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.infra.metrics import Nvml, TreeUsage, datum
from eaglenest.workers.model_servers.embedded.metrics import samples
from eaglenest.workers.model_servers.process import head_draft_limit
from eaglenest.workers.model_servers.schedule import Schedule

log = logging.getLogger("eaglenest.metrics")
SERVER_NAMESPACE = "EagleNest/Endpoints"
INSTANCE_NAMESPACE = "/aws/sagemaker/Endpoints"
SAGEMAKER_NAMESPACE = "AWS/SageMaker"
SAMPLE_SECONDS = 60.0
_FIELDS = {"vllm:generation_tokens_total": "generation",
           "vllm:spec_decode_num_drafts_total": "drafts",
           "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
           "vllm:spec_decode_num_accepted_tokens_total": "accepted",
           "vllm:num_requests_running": "running",
           "eaglenest:speculation_k": "engine_k"}


@dataclass(frozen=True)
class Counters:
    """A model server's counters at `at` (epoch seconds); `engine_k`: the K of its last
    engine step, where it says (the embedded engine), else None."""

    at: float
    generation: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    running: float = 0.0
    engine_k: float | None = None


def parse_counters(page: str, at: float) -> Counters:
    """The counters of a /metrics page, each summed over its label sets (vLLM has one per
    engine)."""
    found: dict[str, float] = {}
    for name, _, value in samples(page):
        field = _FIELDS.get(name)
        if field is not None:
            found[field] = found.get(field, 0.0) + value
    return Counters(at=at, **found)


def read_counters(url: str, secret: str | None, timeout: float = 5.0) -> Counters | None:
    """The instance's counters now; None when it does not answer, or does not prove it
    holds the instance's secret (a process that took a dead instance's port)."""
    headers, expected = instance_auth.handshake(secret) if secret else ({}, "")
    try:
        r = httpx.get(f"{url}/metrics", headers=headers, timeout=timeout)
    except httpx.HTTPError:
        return None
    if r.status_code != 200 or (
            secret and not hmac.compare_digest(r.headers.get(instance_auth.PROOF, ""), expected)):
        return None
    return parse_counters(r.text, time.time())


def k_in_force(record: dict[str, Any], counters: Counters) -> float:
    """The speculation K serving now: 0 without a head; the embedded engine's last step's
    K where it reports one; else the variant's served K (`served_k` in its record: a fixed
    K, or K per load, a schedule's thresholds) at the requests running now; records written
    before `served_k` fall back to `schedule` / `k`, capped by the head's own bound."""
    if not record.get("speculative"):
        return 0.0
    if counters.engine_k is not None:
        return counters.engine_k
    served = record.get("served_k")
    if served is None:
        served = record.get("schedule") or record.get("k") or 0
        if record.get("dir"):
            most = head_draft_limit(Path(record["dir"]) / "head")
            if most is not None:
                served = ([[m, min(int(k), most)] for m, k in served]
                          if isinstance(served, list) else min(int(served), most))
    if isinstance(served, list):
        schedule = Schedule(tuple((int(m), int(k)) for m, k in served))
        return float(schedule.k_for(max(1, int(counters.running))))
    return float(served)


def server_figures(before: Counters, now: Counters, k: float) -> list[tuple[str, float, str]]:
    """(name, value, unit) of "EagleNest/Endpoints" between two samples (module docstring)."""
    out = [("SpeculationK", k, "None")]
    seconds = now.at - before.at
    deltas = [now.generation - before.generation, now.drafts - before.drafts,
              now.draft_tokens - before.draft_tokens, now.accepted - before.accepted]
    if seconds <= 0 or min(deltas) < 0:  # the same instance, restarted: no difference
        return out
    generated, drafts, drafted, accepted = deltas
    out += [("OutputTokensPerSecond", generated / seconds, "Count/Second"),
            ("DraftTokens", drafted, "Count"), ("AcceptedDraftTokens", accepted, "Count")]
    if drafts > 0:
        out.append(("AcceptedTokensPerRound", accepted / drafts + 1.0, "None"))
    return out


@dataclass(frozen=True)
class Served:
    """One instance of a variant this process serves."""

    account_id: str
    endpoint: str
    variant: str
    record: dict[str, Any]  # the variant's
    instance: dict[str, Any]
    child: children.ChildRecord

    @property
    def dims(self) -> dict[str, str]:
        return {"EndpointName": self.endpoint, "VariantName": self.variant}


def served_here(ctx: WorkerContext) -> list[Served]:
    """Every instance in the endpoints' deployments that this process started and runs."""
    me = children.myself()
    with ctx.db.session() as s:
        rows = list(s.execute(select(EndpointRow.account_id, EndpointRow.name,
                                     EndpointRow.deployment)))
    out = []
    for account_id, name, deployment in rows:
        for variant, record in ((deployment or {}).get("Servers") or {}).items():
            for inst in instances_of(record):
                raw = inst.get("child")
                child = children.ChildRecord.from_dict(raw) if raw else None
                if child is not None and child.owner == me and child.identity.alive():
                    out.append(Served(account_id, name, variant, record, inst, child))
    return out


class EndpointSampler:
    """Samples what `served_here` finds every `interval` seconds on its own thread
    (`start` / `stop`, by its owner); `sample()` is one round (module docstring)."""

    def __init__(self, ctx: WorkerContext, interval: float = SAMPLE_SECONDS,
                 nvml: Nvml | None = None) -> None:
        self.ctx = ctx
        self.nvml = nvml or Nvml(ctx.settings.gpus)
        self.usage = TreeUsage()
        self.last: dict[str, Counters] = {}  # by instance (its process tag)
        self.setup_written: set[str] = set()
        self.loop = Loop("eaglenest-endpoint-metrics", self.sample, interval, logger=log)

    def start(self) -> EndpointSampler:
        self.loop.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        self.loop.stop(timeout)
        self.nvml.close()

    def sample(self) -> list[tuple[str, Datum]]:
        """One round over the instances this process serves; the data added, with their
        accounts."""
        served = served_here(self.ctx)
        tags = {sv.child.tag for sv in served}
        for gone in [t for t in self.last if t not in tags]:
            del self.last[gone]
        self.usage.keep(tags)
        self.setup_written &= tags
        added: list[tuple[str, Datum]] = []
        for sv in served:
            data = self._instance(sv)
            self.ctx.metrics.add(sv.account_id, data)
            added += [(sv.account_id, d) for d in data]
        return added

    def _instance(self, sv: Served) -> list[Datum]:
        data = self._setup(sv)
        now = read_counters(sv.instance["url"], sv.instance.get("secret"))
        if now is not None:
            ready = sv.instance.get("ready_at")
            before = self.last.get(sv.child.tag) or (Counters(at=float(ready)) if ready else None)
            self.last[sv.child.tag] = now
            if before is not None:
                data += [datum(SERVER_NAMESPACE, name, sv.dims, value, unit, now.at)
                         for name, value, unit in
                         server_figures(before, now, k_in_force(sv.record, now))]
        return data + self._resources(sv)

    def _setup(self, sv: Served) -> list[Datum]:
        """ModelSetupTime, the first time the instance is seen."""
        seconds, ready = sv.instance.get("setup_seconds"), sv.instance.get("ready_at")
        if sv.child.tag in self.setup_written or seconds is None or ready is None:
            return []
        self.setup_written.add(sv.child.tag)
        return [datum(SAGEMAKER_NAMESPACE, "ModelSetupTime", sv.dims, float(seconds) * 1e6,
                      "Microseconds", float(ready))]

    def _resources(self, sv: Served) -> list[Datum]:
        """The instance's CPU, memory and (NVML) GPUs."""
        at = time.time()
        cpu, memory = self.usage.sample(sv.child.tag, sv.child.running(), at)
        data = [datum(INSTANCE_NAMESPACE, "MemoryUtilization", sv.dims, memory, "Percent", at)]
        if cpu is not None:
            data.append(datum(INSTANCE_NAMESPACE, "CPUUtilization", sv.dims, cpu, "Percent", at))
        gpus = [int(g) for g in sv.instance.get("gpus") or []]
        usage = [self.nvml.usage(g) for g in gpus]
        if gpus and all(u is not None for u in usage):
            data.append(datum(INSTANCE_NAMESPACE, "GPUUtilization", sv.dims,
                              sum(u[0] for u in usage if u), "Percent", at))
            data.append(datum(INSTANCE_NAMESPACE, "GPUMemoryUtilization", sv.dims,
                              sum(u[1] for u in usage if u), "Percent", at))
        return data
