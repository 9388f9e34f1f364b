"""workers/serving/endpoint_metrics.py: a served variant's figures in the metric store.

The arithmetic on a vLLM /metrics page (two engines' label sets), the K in force; then a
real embedded model server (the tiny target with an EAGLE-3 head) started by
workers/serving/deploy.py start_variant and recorded as InService in a real SQLite
database: the sampler writes ModelSetupTime once, the EagleNest/Endpoints figures equal the
differences of the server's own counters around real completions, the process tree's CPU
and memory; an endpoint that leaves the database is sampled no more, and the sampler's
thread stops when the worker's metrics close."""

from __future__ import annotations

import time

import httpx
import pytest

from eaglenest.db import endpoints_repo, metrics_repo
from eaglenest.db.migrate import upgrade_head
from eaglenest.db.session import Database
from eaglenest.foundation.http import instance_auth
from eaglenest.foundation.queue import TaskQueue
from eaglenest.foundation.settings import Settings
from eaglenest.foundation.store.storage import LocalStore, parse_uri
from eaglenest.workers.infra.context import WorkerContext
from eaglenest.workers.model_servers.process import EMBEDDED, ServerSpec
from eaglenest.workers.model_servers.schedule import Schedule
from eaglenest.workers.serving import deploy
from eaglenest.workers.serving.endpoint_metrics import (
    INSTANCE_NAMESPACE,
    SAGEMAKER_NAMESPACE,
    SERVER_NAMESPACE,
    Counters,
    EndpointSampler,
    k_in_force,
    parse_counters,
    read_counters,
    server_figures,
)
from eaglenest.workers.serving.records import deployment, stop_servers
from tests.support.endpoint_rows import ACCOUNT, EP, OTHER, seed_endpoint

PAGE = """# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="m"} 500.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 20.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 60.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 99.0
vllm:num_requests_running{engine="0",model_name="m"} 3.0
"""
DIMS = (("EndpointName", "ep"), ("VariantName", "v"))


def test_figures_are_differences_of_the_servers_counters():
    now = parse_counters(PAGE, at=160.0)
    assert now == Counters(at=160.0, generation=1500, drafts=120, draft_tokens=360,
                           accepted=180, running=3)
    before = Counters(at=100.0, generation=300, drafts=40, draft_tokens=120, accepted=20)
    assert server_figures(before, now, 3) == [
        ("SpeculationK", 3, "None"),
        ("OutputTokensPerSecond", 1200 / 60, "Count/Second"),
        ("DraftTokens", 240, "Count"), ("AcceptedDraftTokens", 160, "Count"),
        ("AcceptedTokensPerRound", 160 / 80 + 1, "None")]
    restarted = Counters(at=220.0, generation=10)  # a new process: its counters from zero
    assert server_figures(now, restarted, 3) == [("SpeculationK", 3, "None")]
    idle = Counters(at=220.0, generation=1500, drafts=120, draft_tokens=360, accepted=180)
    assert ("AcceptedTokensPerRound" in [n for n, _, _ in server_figures(now, idle, 3)]) is False


def test_the_k_in_force():
    running = Counters(at=0.0, running=3)
    assert k_in_force({"speculative": False, "served_k": 5}, running) == 0
    assert k_in_force({"speculative": True, "served_k": 4}, running) == 4
    schedule = {"speculative": True, "served_k": [[1, 5], [4, 2], [16, 0]]}
    assert k_in_force(schedule, running) == 2
    assert k_in_force(schedule, Counters(at=0.0)) == 5  # idle: the K of one request
    engine = Counters(at=0.0, running=3, engine_k=1)  # the embedded engine says its own
    assert k_in_force(schedule, engine) == 1
    assert k_in_force({"speculative": True, "k": 5, "schedule": None}, running) == 5  # older


def test_the_served_k_of_an_embedded_spec(tmp_path):
    spec = ServerSpec(model_dir=tmp_path, served_name="m", port=1, backend=EMBEDDED,
                      head_dir=tmp_path / "head", num_speculative_tokens=4)
    assert deploy.served_k(spec) == 4
    spec.schedule = Schedule(((2, 3), (8, 1)))
    assert deploy.served_k(spec) == [[2, 3], [8, 1]]
    spec.head_dir = None
    assert deploy.served_k(spec) == 0


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_llama_dir, tiny_eagle3_dir):  # type: ignore[no-untyped-def]
    """An InService endpoint `ep` whose variant `v` this test process serves."""
    tmp = tmp_path_factory.mktemp("endpoint-metrics")
    settings = Settings(data_dir=tmp, metrics_flush_seconds=60)
    upgrade_head(settings.resolved_database_url())
    ctx = WorkerContext(settings=settings, db=Database(settings.resolved_database_url()),
                        queue=TaskQueue("redis://127.0.0.1:9/0"), owner="w-1")
    store = LocalStore(tmp / "s3")
    for src, prefix in ((tiny_llama_dir, "models/tiny/"), (tiny_eagle3_dir, "models/head/")):
        for f in sorted(p for p in src.rglob("*") if p.is_file()):
            store.put_file(parse_uri(f"s3://{prefix}{f.relative_to(src).as_posix()}"), f)
    plan = deploy.VariantPlan("v", "m", 1.0, 1, 180, "s3://models/tiny/", "s3://models/head/",
                              env={"EAGLENEST_SERVING_BACKEND": EMBEDDED,
                                   "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3",
                                   "EAGLENEST_MAX_MODEL_LEN": "256"}, account_id=ACCOUNT.account_id)
    record = deploy.start_variant(store, tmp / "endpoints", "ep", plan)
    with ctx.db.session() as s:
        seed_endpoint(s)
        assert endpoints_repo.mark_in_service(s, EP, deployment([plan], {"v": record}))
    yield ctx, record
    stop_servers({"v": record})
    ctx.metrics.close()
    ctx.db.dispose()


def stat(ctx: WorkerContext, namespace: str, name: str, account: str = ACCOUNT.account_id
         ) -> metrics_repo.Stat | None:
    now = time.time()
    with ctx.db.session() as s:
        found = metrics_repo.statistics(s, account, namespace, name, DIMS, now - 3600,
                                        now + 60, 3600)
    return found[0] if found else None


def complete(inst: dict, prompt: str) -> None:
    r = httpx.post(f"{inst['url']}/v1/completions", timeout=120,
                   headers={"Authorization": f"Bearer {inst['secret']}"},
                   json={"model": "ep", "prompt": prompt, "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text


def test_a_served_variant_writes_its_servers_figures(served):
    ctx, record = served
    [inst] = record["instances"]
    sampler = EndpointSampler(ctx)
    first = {d.name for _, d in sampler.sample()}  # from zero at its first /health answer
    assert {"ModelSetupTime", "SpeculationK", "MemoryUtilization"} <= first
    [base] = sampler.last.values()  # the counters the first sample read
    before = read_counters(inst["url"], inst["secret"])
    assert before is not None
    for prompt in ("Natalia sold 48 clips", "def add(a, b):", "The quick brown fox"):
        complete(inst, prompt)
    after = read_counters(inst["url"], inst["secret"])
    assert after is not None and after.drafts > before.drafts
    time.sleep(0.05)
    second = {d.name: d for _, d in sampler.sample()}
    now = read_counters(inst["url"], inst["secret"])
    assert now is not None and now.draft_tokens == after.draft_tokens  # nothing in between
    ctx.metrics.flush()

    assert second["DraftTokens"].value == after.draft_tokens - before.draft_tokens
    assert second["AcceptedDraftTokens"].value == after.accepted - before.accepted
    assert second["AcceptedTokensPerRound"].value == pytest.approx(
        (after.accepted - before.accepted) / (after.drafts - before.drafts) + 1)
    assert second["SpeculationK"].value == after.engine_k == 3
    rate = second["OutputTokensPerSecond"]
    assert rate.value == pytest.approx((after.generation - base.generation) / (rate.at - base.at))
    assert rate.value > 0 and rate.unit == "Count/Second"
    assert second["CPUUtilization"].value > 0  # the server worked between the samples

    drafted = stat(ctx, SERVER_NAMESPACE, "DraftTokens")
    assert drafted is not None and drafted.sum == after.draft_tokens  # from zero, in all
    assert drafted.unit == "Count"
    setup = stat(ctx, SAGEMAKER_NAMESPACE, "ModelSetupTime")  # once, not per sample
    assert setup is not None and setup.sample_count == 1
    assert setup.sum == pytest.approx(inst["setup_seconds"] * 1e6) and setup.unit == "Microseconds"
    assert stat(ctx, INSTANCE_NAMESPACE, "MemoryUtilization").sample_count == 2  # type: ignore[union-attr]
    assert stat(ctx, INSTANCE_NAMESPACE, "GPUUtilization") is None  # no GPU: nothing invented
    assert stat(ctx, SERVER_NAMESPACE, "DraftTokens", OTHER.account_id) is None


def test_the_wrong_secret_reads_nothing(served):
    _, record = served
    [inst] = record["instances"]
    assert read_counters(inst["url"], instance_auth.new_secret()) is None


def test_sampling_stops_with_the_endpoint_and_with_the_worker(served):
    ctx, _ = served
    sampler = EndpointSampler(ctx, interval=0.05)
    ctx.metrics.own(sampler)
    ctx.metrics.start()
    deadline = time.monotonic() + 30
    while sampler.loop.runs < 2:
        assert time.monotonic() < deadline, "the sampler did not sample"
        time.sleep(0.05)
    with ctx.db.session() as s:  # the endpoint's servers leave its row (deleted)
        assert endpoints_repo.request_delete(s, ACCOUNT, "ep") == EP
    with ctx.db.session() as s:
        assert endpoints_repo.finish_delete(s, EP)
    ctx.metrics.close()
    assert not sampler.loop.thread.is_alive()  # its owner closed: its thread ended
    assert sampler.sample() == []  # and the deleted endpoint has nothing to sample
