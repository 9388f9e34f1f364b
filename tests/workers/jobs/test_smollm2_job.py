"""The optimization job on the real SmolLM2-135M target with a ShareGPT file, through boto3
and a real Celery worker: COMPLETED, every output present, output model registered."""

from __future__ import annotations

import json

from tests.support.jobs import ROLE, upload, wait_status
from tests.support.stack import Stack

SHAREGPT = [
    {"conversations": [{"from": "human", "value": f"What is {a} plus {b}?"},
                       {"from": "gpt", "value": f"{a} plus {b} is {a + b}."}]}
    for a, b in [(2, 3), (10, 5), (7, 8), (12, 30), (4, 4), (9, 1), (6, 7), (11, 11)]
]


def test_smollm2_sharegpt_job(tmp_path, smollm2_dir):
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in SHAREGPT) + "\n")
    (tmp_path / "stack").mkdir()
    stack = Stack(tmp_path / "stack").start()
    try:
        upload(stack, smollm2_dir, "s3://models/smollm2/")
        upload(stack, data, "s3://data/chat/chat.jsonl")
        sm = stack.client()
        sm.create_model(ModelName="smollm2", ExecutionRoleArn=ROLE, PrimaryContainer={
            "Image": "eaglenest", "ModelDataSource": {"S3DataSource": {
                "S3Uri": "s3://models/smollm2/", "S3DataType": "S3Prefix",
                "CompressionType": "None"}}})
        sm.create_optimization_job(
            OptimizationJobName="smollm2-eagle3", RoleArn=ROLE,
            ModelSource={"SageMakerModel": {"ModelName": "smollm2"}},
            DeploymentInstanceType="ml.g5.2xlarge",
            OptimizationEnvironment={
                "EAGLENEST_MAX_STEPS": "2", "EAGLENEST_HOLDOUT": "2", "EAGLENEST_REGENERATE": "0",
                "EAGLENEST_DRAFT_VOCAB_SIZE": "2048", "EAGLENEST_BENCH_CONCURRENCY": "1",
                "EAGLENEST_BENCH_MAX_TOKENS": "8", "EAGLENEST_SERVING_BACKEND": "embedded",
                "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3", "EAGLENEST_BENCH_KS": "3"},
            OptimizationConfigs=[{"ModelSpeculativeDecodingConfig": {
                "Technique": "EAGLE", "TrainingDataSource": {
                    "S3Uri": "s3://data/chat/", "S3DataType": "S3Prefix"}}}],
            OutputConfig={"S3OutputLocation": "s3://output/",
                          "SageMakerModel": {"ModelName": "smollm2-eagle3"}},
            StoppingCondition={"MaxRuntimeInSeconds": 1800})
        d = wait_status(sm, "smollm2-eagle3", {"COMPLETED", "FAILED"}, timeout=900)
        assert d["OptimizationJobStatus"] == "COMPLETED", d.get("FailureReason")
        out = stack.data_dir / "s3" / "output" / "smollm2-eagle3"
        cfg = json.loads((out / "eagle_model" / "config.json").read_text())
        assert cfg["draft_vocab_size"] == 2048
        bench = json.loads((out / "benchmark.json").read_text())
        assert bench["results"]["chain K=3"][0]["output_tokens"] > 0
        model = sm.describe_model(ModelName="smollm2-eagle3")["PrimaryContainer"]
        assert model["AdditionalModelDataSources"][0]["ChannelName"] == "eagle_model"
    finally:
        stack.stop()
