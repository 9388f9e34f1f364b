"""README's walkthrough (the three SageMaker paths, then an endpoint) runs as written against
a real stack: the block is cut out of README.md and executed; only the server address, the
job options (a tiny model, two training steps) and the serving backend are swapped in."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from benchmarks.stack import ACCESS_KEY, REGION, SECRET_KEY, Stack
from tests.support.jobs import upload

ROOT = Path(__file__).resolve().parents[2]

TINY_OPTIONS = {
    "EAGLENEST_MAX_STEPS": "2", "EAGLENEST_MAX_LENGTH": "192", "EAGLENEST_HOLDOUT": "2",
    "EAGLENEST_DATASET": "gsm8k_training.jsonl", "EAGLENEST_BENCH_CONCURRENCY": "1",
    "EAGLENEST_BENCH_MAX_TOKENS": "8", "EAGLENEST_SERVING_BACKEND": "embedded",
    "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3"}


def walkthrough() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Walkthrough: the three SageMaker paths"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def swap(code: str, old: str, new: str) -> str:
    assert code.count(old) == 1, old
    return code.replace(old, new)


def test_walkthrough_runs_as_written(tmp_path, tiny_llama_dir, monkeypatch):
    code = walkthrough()
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps({"conversations": [
        {"from": "human", "value": f"What is {a} times 3?"},
        {"from": "gpt", "value": f"{a} times 3 is {3 * a}."}]}) for a in range(12)) + "\n")
    (tmp_path / "stack").mkdir()
    stack = Stack(tmp_path / "stack").start()
    try:
        upload(stack, tiny_llama_dir, "s3://models/smollm2/")
        upload(stack, data, "s3://data/train/train.jsonl")
        code = swap(code, 'URL = "http://127.0.0.1:8080"', f'URL = "{stack.url}"')
        code = swap(code, 'OPTIONS = {"EAGLENEST_MAX_STEPS": "400"}', f"OPTIONS = {TINY_OPTIONS!r}")
        code = swap(code, "SERVING = {}", 'SERVING = {"EAGLENEST_SERVING_BACKEND": "embedded"}')
        for name, value in (("AWS_ACCESS_KEY_ID", ACCESS_KEY),
                            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                            ("AWS_DEFAULT_REGION", REGION)):
            monkeypatch.setenv(name, value)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "README.md walkthrough", "exec"), {"__name__": "walkthrough"})

        sm = stack.client()
        for job in ("smollm2-mydata", "smollm2-byo-eagle", "smollm2-builtin"):
            d = sm.describe_optimization_job(OptimizationJobName=job)
            assert d["OptimizationJobStatus"] == "COMPLETED", (job, d.get("FailureReason"))
            out = stack.data_dir / "s3" / "output" / job
            assert (out / "benchmark.md").is_file() and (out / "eagle_model").is_dir()
        out = stack.data_dir / "s3" / "output"
        byo = json.loads((out / "smollm2-byo-eagle" / "eagle_model" / "provenance.json")
                         .read_text())
        assert byo["train_config"]["init_head"]  # path 2 started from job 1's head
        builtin = json.loads((out / "smollm2-builtin" / "provenance.json").read_text())
        assert "gsm8k_training.jsonl" in json.dumps(builtin)  # path 3: built-in data
        ep = sm.describe_endpoint(EndpointName="smollm2-eagle")
        assert ep["EndpointStatus"] == "InService"
        assert printed.getvalue().endswith("\n")  # the invocation's generated_text
    finally:
        stack.stop()


@pytest.mark.parametrize("old", ['URL = "http://127.0.0.1:8080"',
                                 'OPTIONS = {"EAGLENEST_MAX_STEPS": "400"}', "SERVING = {}"])
def test_walkthrough_has_the_swapped_lines(old):
    assert walkthrough().count(old) == 1
