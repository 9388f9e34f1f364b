"""The GPU check's `service` section: EagleNest itself on this host, end to end (the steps:
benchmarks/gpu_check/service_drive.py), with the check's target saved as a model folder.

The service runs in a virtualenv over the host's own torch and transformers
(``--system-site-packages``) with the service's other wheels installed offline from
``--wheels`` (scripts/gpu_wheels.sh builds them for the device's Python; they travel with
the tree); without ``--wheels`` it runs in the check's own interpreter (a development
environment that has them, e.g. the CPU test)."""

from __future__ import annotations

import json
import site
import subprocess
import sys
import time
import venv
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check.build import Bench, build_model, log

#: training steps of the section's job (about a minute of a 1B head on a data-centre GPU)
STEPS = {"tiny": 20, "1b": 1500, "8b": 600}


def save_target(bench: Bench, folder: Path) -> Path:
    """The check's random target as a model folder a job accepts (weights in bf16 on CUDA,
    a small tokenizer: its ids are all below the target's vocabulary)."""
    from transformers import GenerationConfig

    from eaglenest.models.tiny import build_tokenizer

    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    model: Any = build_model(bench.spec, bench.device)
    if bench.device.type == "cuda":
        model = model.to(torch.bfloat16)
    model.config.update({"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
                         "pad_token_id": tok.pad_token_id})
    model.save_pretrained(folder)
    GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id).save_pretrained(folder)
    del model
    return folder


def service_python(out: Path, wheels: Path | None) -> str:
    """The interpreter the service runs in (a venv with the wheels, else this one)."""
    if wheels is None:
        return sys.executable
    env = out / "service-venv"
    python = env / "bin" / "python"
    if not python.exists():
        venv.create(env, system_site_packages=True, with_pip=True)
        _see_host_packages(python)
        files = sorted(str(w) for w in wheels.glob("*.whl"))
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        *files], check=True, timeout=900)
    return str(python)


def _see_host_packages(python: Path) -> None:
    """Put this interpreter's site-packages on the venv's path, after its own: where the
    host's Python is itself a venv (/opt/torch/.venv on the device), ``system_site_packages``
    reaches only the base interpreter's, which lacks torch."""
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                              "'purelib'))"], check=True, capture_output=True, text=True)
    host = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib.stdout.strip()) / "_eaglenest_host.pth").write_text("\n".join(host) + "\n")


def section(bench: Bench) -> dict[str, Any]:
    out, wheels = bench.out, bench.wheels
    t0 = time.perf_counter()
    model = save_target(bench, out / f"target-{bench.spec.name}")
    saved = time.perf_counter() - t0
    python = service_python(out, wheels)
    report_file = out / f"service-{bench.spec.name}.json"
    data_dir = out / f"service-data-{bench.spec.name}"
    log(f"{bench.spec.name} service: target saved in {saved:.0f}s; eaglenest up in {python}")
    done = subprocess.run(
        [python, "-m", "benchmarks.gpu_check.service_drive", "--model", str(model),
         "--data-dir", str(data_dir), "--steps", str(STEPS[bench.spec.name]),
         "--out", str(report_file)],
        cwd=Path(__file__).resolve().parents[2], timeout=3000)
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    if done.returncode != 0:
        raise RuntimeError(report.get("error") or f"the service drive exited {done.returncode}"
                           f"; see {out / 'service-up.log'}")
    return {"save_seconds": saved, **report}
