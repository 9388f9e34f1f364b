"""`up`'s console filter (workers/infra/console.py) and the DeployedImages of a deployment
record (foundation/deployment.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from eaglenest.foundation.deployment import deployed_images, variant_summaries
from eaglenest.workers.infra.console import ErrorLines, UpLog


def test_the_console_shows_error_records_with_their_traceback_and_bare_tracebacks() -> None:
    lines = [
        ("2026-01-01 10:00:00,000 INFO celery.worker ready.", False),
        (" -------------- [queues]", False),
        ("2026-01-01 10:00:00,001 WARNING py.warnings SecurityWarning: superuser", False),
        ("2026-01-01 10:00:01,000 ERROR eaglenest.api unhandled error", True),
        ("Traceback (most recent call last):", True),
        ('  File "x.py", line 1, in <module>', True),
        ("2026-01-01 10:00:02,000 INFO eaglenest.api next", False),
        ("Traceback (most recent call last):", True),
        ("ValueError: boom", True),
        (json.dumps({"level": "CRITICAL", "message": "down"}), True),
        (json.dumps({"level": "INFO", "message": "up"}), False),
        ("{not json", False),
    ]
    shown = ErrorLines()
    assert [(line, shown.shows(line)) for line, _ in lines] == lines


def test_deployed_images_of_a_record_and_of_one_written_before_them() -> None:
    record = {"backend": "embedded", "image": "vllm", "resolved_image": "eaglenest/embedded:0.1.0",
              "resolved_at": 1767225600.0}
    assert deployed_images(record) == [{
        "SpecifiedImage": "vllm", "ResolvedImage": "eaglenest/embedded:0.1.0",
        "ResolutionTime": datetime(2026, 1, 1, tzinfo=UTC)}]
    assert deployed_images({"backend": "vllm"}) == [{"ResolvedImage": "eaglenest/vllm"}]
    assert deployed_images({}) == []
    deployment = {"ProductionVariants": [{"VariantName": "A"}, {"VariantName": "B"}],
                  "Servers": {"A": {"backend": "vllm"}}}
    assert variant_summaries(deployment) == [
        {"VariantName": "A", "DeployedImages": [{"ResolvedImage": "eaglenest/vllm"}]},
        {"VariantName": "B"}]
    assert variant_summaries({}) is None


def test_the_log_file_is_rotated_past_its_bound(tmp_path: Path) -> None:
    log = UpLog(tmp_path / "eaglenest.log", max_bytes=100)
    try:
        for i in range(30):
            log.write(f"line {i:02d}\n")  # 8 bytes each
    finally:
        log.close()
    older = (tmp_path / "eaglenest.log.1").read_text()
    newer = (tmp_path / "eaglenest.log").read_text()
    assert len(older) >= 100 and len(newer) < 100 + 8
    assert (older + newer).endswith("line 29\n") and "line 00" not in newer
