"""docker-compose.yml, its overrides and the Dockerfiles, checked by parsing (default suite).

The real run - images built, the stack up, driven, containers killed - is
scripts/compose_check.sh, a CI stage of its own (.ci/run). These checks keep the files
consistent with each other and make sure the CI override swaps only what it must.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from eaglenest.foundation.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def load(path: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / path).read_text())  # type: ignore[no-any-return]


COMPOSE = load("docker-compose.yml")
SERVICES = COMPOSE["services"]
PORTS = load("docker-compose.override.yml")["services"]
GPU = load("docker/compose.gpu.yml")["services"]
CI = load("docker/compose.ci.yml")["services"]
EAGLENEST = ("migrate", "api", "worker-train", "worker-serve")  # the eaglenest image
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
INTERPOLATION = re.compile(r"\$\{([A-Z_][A-Z0-9_]*)(:?[-?])?([^}]*)\}")
DOCKERFILES = ["docker/eaglenest.Dockerfile", "docker/worker-gpu.Dockerfile",
               "docker/ci/postgres.Dockerfile", "docker/ci/redis.Dockerfile",
               "docker/ci/s3.Dockerfile", "docker/ci/prometheus.Dockerfile"]


def test_the_stack_has_every_part():
    assert set(SERVICES) == {"postgres", "redis", "minio", "create-buckets", "migrate", "api",
                             "worker-train", "worker-serve", "prometheus", "grafana"}
    # Grafana only on request (its image needs a registry everywhere): `up` never starts it
    assert [n for n, s in SERVICES.items() if "profiles" in s] == ["grafana"]
    assert SERVICES["postgres"]["image"].startswith("postgres:")
    assert SERVICES["redis"]["image"].startswith("redis:")
    assert SERVICES["minio"]["image"].startswith("minio/minio")
    assert SERVICES["migrate"]["command"] == ["eaglenest", "migrate"]
    queues = {s: SERVICES[s]["command"][SERVICES[s]["command"].index("--queues") + 1]
              for s in ("worker-train", "worker-serve")}
    assert queues == {"worker-train": "train", "worker-serve": "serve"}
    # one image, built the same way by every service that runs it
    assert {SERVICES[s]["image"] for s in EAGLENEST} == {"eaglenest/eaglenest:latest"}
    builds = [SERVICES[s]["build"] for s in EAGLENEST]
    assert all(b == builds[0] for b in builds)
    assert builds[0]["dockerfile"] == "docker/eaglenest.Dockerfile"
    assert builds[0]["args"]["BASE_IMAGE"] == "${EAGLENEST_BASE_IMAGE:-python:3.11-slim}"


def test_depends_on_is_well_formed():
    for name, svc in SERVICES.items():
        for dep, spec in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, (name, dep)
            assert spec["condition"] in CONDITIONS, (name, dep)
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{dep} needs a healthcheck"
            if spec["condition"] == "service_completed_successfully":
                assert SERVICES[dep].get("restart") == "no", f"{dep} must be a one-shot"
    # migrations run once, before anything that uses the database
    for name in ("api", "worker-train", "worker-serve"):
        assert SERVICES[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"}


def test_long_running_services_have_healthchecks():
    for name in ("postgres", "redis", "minio", "api", "worker-train", "worker-serve",
                 "prometheus", "grafana"):
        hc = SERVICES[name]["healthcheck"]
        assert hc["test"][0] in ("CMD", "CMD-SHELL"), name
        assert hc["retries"] >= 3
        assert SERVICES[name]["restart"] == "unless-stopped", name


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
                   "REDIS_PASSWORD", "EAGLENEST_METRICS_TOKEN"):
        assert refs.get(secret) == ":?", f"{secret} must use ${{{secret}:?...}}"


def test_ports_are_published_by_the_overrides_users_run_not_the_base():
    # host networking (CI) refuses published ports, and an override cannot remove them
    assert not any("ports" in svc for svc in SERVICES.values())
    # Prometheus and Grafana show every account's series unsigned: loopback only
    assert PORTS == {"minio": {"ports": ["9000:9000", "9001:9001"]},
                     "api": {"ports": ["8080:8080"]},
                     "prometheus": {"ports": ["127.0.0.1:9090:9090"]},
                     "grafana": {"ports": ["127.0.0.1:3000:3000"]}}
    for name, spec in PORTS.items():
        assert GPU[name] == spec, f"docker/compose.gpu.yml must publish {name}'s ports too"


def test_gpu_override_swaps_only_the_workers_image_and_reserves_gpus():
    assert set(GPU) == {"minio", "api", "worker-train", "worker-serve", "prometheus", "grafana"}
    # both workers see every GPU: one host name, so placement never gives a GPU twice
    hosts = {GPU[n]["environment"]["EAGLENEST_HOST_NAME"] for n in ("worker-train", "worker-serve")}
    assert hosts == {"${EAGLENEST_HOST_NAME:-gpu-box}"} and "host_name" in Settings.model_fields
    for name in ("worker-train", "worker-serve"):
        svc = GPU[name]
        assert set(svc) == {"build", "image", "environment", "deploy"}, name
        assert set(svc["environment"]) == {"EAGLENEST_HOST_NAME"}, name
        assert svc["image"] == "eaglenest/worker-gpu:latest"
        assert svc["build"]["dockerfile"] == "docker/worker-gpu.Dockerfile"
        assert "nvidia/cuda" in svc["build"]["args"]["BASE_IMAGE"]
        devices = svc["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert SERVICES["worker-serve"]["environment"]["EAGLENEST_ADVERTISE_HOST"] == "worker-serve"


def test_ci_override_swaps_only_what_cannot_be_pulled():
    assert set(CI) == set(SERVICES), "every service runs with host networking in CI"
    # the names the URLs use, Prometheus's target and Grafana's data source
    hosts = {"postgres", "redis", "minio", "worker-serve", "api", "prometheus"}
    for name, svc in CI.items():
        assert svc["network_mode"] == "host", name
        assert {h.split(":")[0] for h in svc["extra_hosts"]} == hosts, name
        assert all(h.endswith(":127.0.0.1") for h in svc["extra_hosts"]), name
    allowed = {"network_mode", "extra_hosts"}
    for name in EAGLENEST:  # the eaglenest image as users build it; builds use the host network
        assert set(CI[name]) == allowed | {"build"} and CI[name]["build"] == {"network": "host"}
    # postgres, redis, prometheus: Debian's packages, the base file's environment, volumes,
    # command and healthcheck
    for name in ("postgres", "redis", "prometheus"):
        assert set(CI[name]) == allowed | {"build", "image"}, name
        assert CI[name]["build"]["dockerfile"] == f"{name}.Dockerfile"
    # S3: moto_server in place of MinIO, boto3 in place of mc
    assert set(CI["minio"]) == allowed | {"build", "image", "command", "healthcheck"}
    assert CI["minio"]["command"][0] == "moto_server"
    assert set(CI["create-buckets"]) == allowed | {"image", "entrypoint", "command"}
    assert CI["create-buckets"]["image"] == CI["minio"]["image"]
    for bucket in ("models", "data", "output", "capture"):
        assert f'"{bucket}"' in CI["create-buckets"]["command"][0]
        assert f"local/{bucket}" in SERVICES["create-buckets"]["command"][0]
    assert set(CI["grafana"]) == allowed  # never started in CI: no image to pull
    for name in ("postgres", "redis", "minio", "prometheus"):
        build = CI[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
        assert build["network"] == "host"
        assert build["args"]["BASE_IMAGE"].startswith("${EAGLENEST_BASE_IMAGE:?")


def test_volumes_are_declared():
    declared = set(COMPOSE["volumes"])
    for svc in SERVICES.values():
        for v in svc.get("volumes") or []:
            source = v.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in declared, source


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfiles(dockerfile):
    text = (ROOT / dockerfile).read_text()
    assert text.startswith("# ")
    assert re.search(r"^ARG BASE_IMAGE=\S+$", text, re.M), "the base image is a build argument"
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.M)
    assert re.search(r"^USER (?!root)\S+", text, re.M), "images run as a non-root user"
    context = ROOT if dockerfile.count("/") == 1 else ROOT / "docker" / "ci"
    for src in re.findall(r"^COPY (?!--from)(\S+)", text, re.M):
        assert (context / src).exists(), src
    for src in re.findall(r"--mount=type=bind,source=([^,\s]+)", text):
        assert (context / src).exists() or src.endswith("wheelhouse"), src
    if dockerfile.startswith("docker/ci/"):
        assert "local/debian:bookworm" in text
    if dockerfile == "docker/eaglenest.Dockerfile":
        assert "HEALTHCHECK" in text and "requirements/service.txt" in text
        assert "--no-deps" in text and "download.pytorch.org/whl/cpu" in text
    if dockerfile == "docker/worker-gpu.Dockerfile":
        assert "nvidia/cuda" in text and "vllm" in text and "HEALTHCHECK" in text


def test_redis_needs_a_password_and_has_no_config_command():
    command = SERVICES["redis"]["command"]
    assert command[command.index("--requirepass") + 1].startswith("${REDIS_PASSWORD:?")
    renamed = {command[i + 1]: command[i + 2] for i, a in enumerate(command)
               if a == "--rename-command"}
    assert {k: renamed.get(k) for k in ("CONFIG", "DEBUG", "MODULE")} == \
        {"CONFIG": "", "DEBUG": "", "MODULE": ""}
    url = SERVICES["api"]["environment"]["EAGLENEST_BROKER_URL"]
    assert url.startswith("redis://:${REDIS_PASSWORD:?") and url.endswith("@redis:6379/0")


def test_no_python_module_paths_of_ours():
    """Containers use the `eaglenest` console script and HTTP only: module paths move."""
    ours = r"(api|db|workers|models|migrations|eaglenest)"
    pattern = re.compile(rf"(-m\s+{ours}\b|import\s+{ours}\b|from\s+{ours}\b)")
    for path in ["docker-compose.yml", "docker-compose.override.yml", "docker/compose.gpu.yml",
                 "docker/compose.ci.yml", "scripts/compose_check.sh", *DOCKERFILES]:
        assert not pattern.search((ROOT / path).read_text()), path


def test_ci_runs_the_compose_check():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/compose_check.sh" in ci and "bash scripts/test.sh" in ci
    assert "exec bash scripts/test.sh" not in ci  # both stages run


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose not installed")
@pytest.mark.parametrize("override", ["docker-compose.override.yml", "docker/compose.gpu.yml",
                                      "docker/compose.ci.yml"])
def test_docker_compose_accepts_the_files(override):
    env = {**os.environ, "POSTGRES_PASSWORD": "p", "MINIO_ROOT_USER": "u",
           "MINIO_ROOT_PASSWORD": "secret123", "EAGLENEST_ACCESS_KEY_ID": "k",
           "EAGLENEST_SECRET_ACCESS_KEY": "s", "REDIS_PASSWORD": "r",
           "EAGLENEST_METRICS_TOKEN": "m" * 16,
           "EAGLENEST_BASE_IMAGE": "local/debian:bookworm"}
    r = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "-f", override, "config",
                        "-q"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    del env["POSTGRES_PASSWORD"]
    r = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "-f", override, "config",
                        "-q"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "set POSTGRES_PASSWORD" in r.stderr


def test_compose_check_proves_the_security_model_before_the_drive():
    """scripts/compose_check.sh runs tests/docker/compose_security.py (unsigned requests,
    Environment injection, a second account, Redis) on the stack, before the long drive."""
    script = (ROOT / "scripts" / "compose_check.sh").read_text()
    security = script.index('"$PY" tests/docker/compose_security.py --project "$PROJECT"')
    assert security < script.index('"$PY" tests/docker/compose_drive.py')
    checks = (ROOT / "tests" / "docker" / "compose_security.py").read_text()
    for name in ("check_unsigned()", "check_environment(sm)", "check_accounts(sm, ",
                 "check_redis()"):
        assert name in checks.split("def main")[1], name


def test_compose_check_builds_prometheus_and_queries_it_after_the_drive():
    """Prometheus's image is built (and cached) with the others, its port is free before
    `up`, and tests/docker/compose_prometheus.py runs once the drive left an endpoint."""
    script = (ROOT / "scripts" / "compose_check.sh").read_text()
    build = next(line for line in script.splitlines() if "build --parallel" in line)
    assert " prometheus " in build
    ports = re.search(r"^PORTS=\(([^)]*)\)", script, re.M)
    assert ports and "9090" in ports.group(1).split()
    drive = script.index('"$PY" tests/docker/compose_drive.py')
    assert drive < script.index('"$PY" tests/docker/compose_prometheus.py')
    # the workers sample within seconds, so the dashboard's store figures show in time
    assert "EAGLENEST_METRICS_SAMPLE_SECONDS=${EAGLENEST_METRICS_SAMPLE_SECONDS:-10}" in script
    env = SERVICES["api"]["environment"]
    assert env["EAGLENEST_METRICS_SAMPLE_SECONDS"] == "${EAGLENEST_METRICS_SAMPLE_SECONDS:-60}"
