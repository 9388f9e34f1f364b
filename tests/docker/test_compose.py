"""docker-compose.yml and the Dockerfiles, checked by parsing (no Docker engine in CI)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from eaglenest.foundation.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
INTERPOLATION = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(:?[-?])?([^}]*)\}")


def test_the_stack_has_every_part():
    assert set(SERVICES) == {"postgres", "redis", "minio", "create-buckets", "migrate", "api",
                             "worker-train", "worker-serve"}
    assert SERVICES["postgres"]["image"].startswith("postgres:")
    assert SERVICES["redis"]["image"].startswith("redis:")
    assert SERVICES["minio"]["image"].startswith("minio/minio")
    assert SERVICES["migrate"]["command"] == ["eaglenest", "migrate"]
    assert "--queues" in SERVICES["worker-train"]["command"]
    queues = {s: SERVICES[s]["command"][SERVICES[s]["command"].index("--queues") + 1]
              for s in ("worker-train", "worker-serve")}
    assert queues == {"worker-train": "train", "worker-serve": "serve"}


def test_depends_on_is_well_formed():
    for name, svc in SERVICES.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, (name, dep)
            assert spec["condition"] in CONDITIONS, (name, dep)
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{dep} needs a healthcheck"
            if spec["condition"] == "service_completed_successfully":
                assert SERVICES[dep].get("restart") == "no", f"{dep} must be a one-shot"


def test_long_running_services_have_healthchecks():
    for name in ("postgres", "redis", "minio", "api", "worker-train", "worker-serve"):
        hc = SERVICES[name]["healthcheck"]
        assert hc["test"][0] in ("CMD", "CMD-SHELL"), name
        assert hc["retries"] >= 3


def test_every_eaglenest_variable_exists_in_settings():
    fields = {f"EAGLENEST_{f.upper()}" for f in Settings.model_fields}
    seen = set()
    for svc in SERVICES.values():
        env = svc.get("environment") or {}
        if isinstance(env, dict):
            for key in env:
                if key.startswith("EAGLENEST_"):
                    seen.add(key)
                    assert key in fields, f"{key} is not a Settings field"
    assert {"EAGLENEST_DATABASE_URL", "EAGLENEST_BROKER_URL", "EAGLENEST_S3_ENDPOINT_URL"} <= seen


def test_secrets_are_required_not_defaulted():
    text = (ROOT / "docker-compose.yml").read_text()
    refs = {m.group(1): m.group(2) for m in INTERPOLATION.finditer(text)}
    for secret in ("POSTGRES_PASSWORD", "EAGLENEST_ACCESS_KEY_ID",
                   "EAGLENEST_SECRET_ACCESS_KEY", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD",
                   "REDIS_PASSWORD"):
        assert refs.get(secret) == ":?", f"{secret} must use ${{{secret}:?...}}"


def test_gpu_workers_reserve_nvidia_devices():
    for name in ("worker-train", "worker-serve"):
        devices = SERVICES[name]["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert SERVICES["worker-serve"]["environment"]["EAGLENEST_ADVERTISE_HOST"] == "worker-serve"


def test_volumes_are_declared():
    declared = set(COMPOSE["volumes"])
    for svc in SERVICES.values():
        for v in svc.get("volumes") or []:
            source = v.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in declared, source


@pytest.mark.parametrize("dockerfile", ["api", "worker-cpu", "worker-gpu"])
def test_dockerfiles(dockerfile):
    path = ROOT / "docker" / f"{dockerfile}.Dockerfile"
    text = path.read_text()
    assert re.search(r"^USER (?!root)\S+", text, re.M), "images run as a non-root user"
    assert "HEALTHCHECK" in text
    for src in re.findall(r"^COPY (\S+)", text, re.M):
        assert (ROOT / src).exists(), src
    if dockerfile == "worker-gpu":
        assert text.startswith("# ") and "nvidia/cuda" in text and "vllm" in text
    if dockerfile == "worker-cpu":
        assert "torch==2.13.0" in text and "download.pytorch.org/whl/cpu" in text


def test_build_contexts_point_at_existing_dockerfiles():
    for svc in SERVICES.values():
        build = svc.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file()


def test_redis_needs_a_password_and_has_no_config_command():
    command = SERVICES["redis"]["command"]
    assert command[command.index("--requirepass") + 1].startswith("${REDIS_PASSWORD:?")
    renamed = {command[i + 1]: command[i + 2] for i, a in enumerate(command)
               if a == "--rename-command"}
    assert {k: renamed.get(k) for k in ("CONFIG", "DEBUG", "MODULE")} == \
        {"CONFIG": "", "DEBUG": "", "MODULE": ""}
    url = SERVICES["api"]["environment"]["EAGLENEST_BROKER_URL"]
    assert url.startswith("redis://:${REDIS_PASSWORD:?") and url.endswith("@redis:6379/0")
