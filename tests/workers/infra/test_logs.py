"""Structured logs (workers/infra/logs.py): JSON lines with ts/level/logger/message, job and
endpoint names from the log context, exception text; the worker's tasks open that context;
a real `eaglenest worker` process with EAGLENEST_LOG_FORMAT=json logs JSON lines only."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from eaglenest.foundation.host.processes import free_port
from eaglenest.foundation.settings import Settings
from eaglenest.workers.infra.logs import (
    JsonFormatter,
    TextFormatter,
    configure_logging,
    current_context,
    log_context,
)
from tests.support.logs import configured_logging

ROOT = Path(__file__).resolve().parents[3]


def _record(msg: str = "hello %s", args: tuple = ("world",), level: int = logging.INFO,
            exc_info=None, **extra) -> logging.LogRecord:
    record = logging.LogRecord("eaglenest.test", level, __file__, 1, msg, args, exc_info)
    for k, v in extra.items():
        setattr(record, k, v)
    return record


def test_json_line_has_the_base_fields():
    line = JsonFormatter().format(_record(level=logging.WARNING))
    assert "\n" not in line
    entry = json.loads(line)
    assert set(entry) == {"ts", "level", "logger", "message"}
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "eaglenest.test"
    assert entry["message"] == "hello world"
    assert entry["ts"].endswith("Z")
    ts = datetime.fromisoformat(entry["ts"].replace("Z", "+00:00"))
    assert ts.utcoffset() is not None and ts.utcoffset().total_seconds() == 0
    assert abs(ts.timestamp() - time.time()) < 60


def test_job_and_endpoint_come_from_the_context():
    fmt = JsonFormatter()
    assert "job" not in json.loads(fmt.format(_record()))
    with log_context(job="job-1"):
        assert json.loads(fmt.format(_record()))["job"] == "job-1"
        with log_context(endpoint="ep-1"):
            entry = json.loads(fmt.format(_record()))
            assert (entry["job"], entry["endpoint"]) == ("job-1", "ep-1")
        assert "endpoint" not in json.loads(fmt.format(_record()))
        # `extra=` on the call wins over the context
        assert json.loads(fmt.format(_record(job="other")))["job"] == "other"
    assert current_context() == {}
    assert "job" not in json.loads(fmt.format(_record()))


def test_context_is_per_thread():
    seen: dict[str, dict] = {}

    def other() -> None:
        seen["other"] = current_context()

    with log_context(job="mine"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        seen["mine"] = current_context()
    assert seen == {"mine": {"job": "mine"}, "other": {}}


def test_exception_text_is_in_exc():
    try:
        raise ValueError("boom \"quoted\"\nsecond line")
    except ValueError:
        record = _record("job failed", (), logging.ERROR, exc_info=sys.exc_info())
    with log_context(job="j"):
        entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "job failed"
    assert entry["job"] == "j"
    assert entry["exc"].startswith("Traceback (most recent call last):")
    assert 'ValueError: boom "quoted"\nsecond line' in entry["exc"]


def test_text_format_names_the_job():
    with log_context(endpoint="ep-9"):
        line = TextFormatter().format(_record())
    assert line.endswith("INFO eaglenest.test hello world [endpoint=ep-9]")
    assert "[" not in TextFormatter().format(_record())


def test_configure_logging_json_through_the_root_logger(capfd):
    with configured_logging("json") as root:
        configure_logging("json")  # idempotent: still one line per record
        assert len(root.handlers) == 1
        with log_context(job="cfg"):
            logging.getLogger("eaglenest.x").info("through root")
        err = capfd.readouterr().err.strip().splitlines()
        assert [json.loads(x)["message"] for x in err] == ["through root"]
        assert json.loads(err[0])["job"] == "cfg"


def test_http_clients_log_no_line_per_request(capfd):
    """After the worker's set-up (configure_logging), an httpx request logs nothing at INFO
    ("HTTP Request: POST ... 200 OK"); its warnings still pass."""
    import httpx

    with configured_logging("text"):
        transport = httpx.MockTransport(lambda request: httpx.Response(200, json={}))
        with httpx.Client(transport=transport) as client:
            assert client.post("http://server/v1/completions", json={}).status_code == 200
        logging.getLogger("eaglenest.x").info("ours")
        logging.getLogger("httpx").warning("a client warning")
        err = capfd.readouterr().err
        assert "HTTP Request" not in err and "INFO eaglenest.x ours" in err
        assert "WARNING httpx a client warning" in err
        assert logging.getLogger("httpcore").getEffectiveLevel() == logging.WARNING


def test_settings_log_format(monkeypatch):
    monkeypatch.delenv("EAGLENEST_LOG_FORMAT", raising=False)
    assert Settings().log_format == "text"
    monkeypatch.setenv("EAGLENEST_LOG_FORMAT", "json")
    assert Settings().log_format == "json"
    monkeypatch.setenv("EAGLENEST_LOG_FORMAT", "xml")
    with pytest.raises(ValueError):
        Settings()


def test_celery_tasks_log_with_their_job_or_endpoint(tmp_path):
    """create_celery's task_prerun/postrun hooks: the task body sees job / endpoint."""
    from eaglenest.workers.infra.celery_app import create_celery, task_log_fields

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/x.db")
    app, _ = create_celery(settings, "memory://")

    @app.task(name="eaglenest.endpoint.probe")
    def probe(name: str) -> dict:
        return current_context()

    @app.task(name="eaglenest.optimize.probe")
    def other(name: str) -> dict:
        return current_context()

    assert probe.apply(args=["ep-7"]).get() == {"endpoint": "ep-7"}
    assert other.apply(args=["x"]).get() == {}
    assert current_context() == {}
    assert task_log_fields("eaglenest.optimize", ["job-3"]) == {"job": "job-3"}
    assert task_log_fields("eaglenest.endpoint.delete", ("ep",)) == {"endpoint": "ep"}
    # tasks are sent with ARNs: the lines say account/name (two accounts may use one name)
    arn = "arn:aws:sagemaker:us-east-1:123456789012:optimization-job/job-3"
    assert task_log_fields("eaglenest.optimize", [arn]) == {"job": "123456789012/job-3"}


def test_worker_process_logs_json_lines(tmp_path):
    """A real `python -m eaglenest.cli worker` with EAGLENEST_LOG_FORMAT=json and a broker
    that refuses connections: Celery's own error record comes out as a JSON line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EAGLENEST_")}
    env.update(EAGLENEST_LOG_FORMAT="json", EAGLENEST_DATA_DIR=str(tmp_path),
               EAGLENEST_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "eaglenest.cli", "worker", "--queues", "serve",
         "--concurrency", "1"], env=env, cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    timer = threading.Timer(60, proc.kill)
    timer.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "Cannot connect" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += rest.splitlines()
    entries = [json.loads(x) for x in lines if x.strip()]  # every stderr line is JSON
    errors = [e for e in entries if e["level"] == "ERROR"]
    assert errors, lines
    assert errors[0]["logger"].startswith("celery.")
    assert "Cannot connect to redis://" in errors[0]["message"]
    assert all({"ts", "level", "logger", "message"} <= set(e) for e in entries)


class Ticks:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_tqdm_and_print_become_info_records(caplog):
    """The worker's stdout/stderr (LogStream): print() lines and tqdm bars as INFO records,
    a bar's redraws at most one per interval, its final state always."""
    from tqdm import tqdm

    from eaglenest.workers.infra.logs import LogStream

    clock = Ticks()
    stream = LogStream("eaglenest.stderr", interval=10.0, clock=clock)
    caplog.set_level(logging.INFO, logger="eaglenest.stderr")
    with log_context(job="job-9"):
        print("plain line", file=stream)
        bar = tqdm(total=100, desc="Loading weights", file=stream, mininterval=0, ascii=True)
        for _ in range(100):
            bar.update(1)
            clock.t += 0.5  # 50 s in all: a redraw logged at most every 10 s
        bar.close()
        stream.write("partial")  # no line end yet: nothing logged
        records = [r for r in caplog.records if r.name == "eaglenest.stderr"]
        assert TextFormatter().format(records[-1]).endswith(" [job=job-9]")
    assert {r.levelno for r in records} == {logging.INFO}
    messages = [r.getMessage() for r in records]
    assert messages[0] == "plain line"
    bars = messages[1:]
    assert 3 <= len(bars) <= 7, bars
    assert all(b.startswith("Loading weights:") for b in bars)
    assert bars[-1].startswith("Loading weights: 100%|##########| 100/100")
