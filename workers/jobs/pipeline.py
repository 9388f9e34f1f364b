"""The optimization-job pipeline, stage by stage (all real work; models/ does the torch).

fetch model -> check files -> load target (only its ends when vLLM captures and
regenerates: models/target.py ``load_target_ends``) -> load data
(workers/jobs/job_data.py; the target regenerates the answers unless
EAGLENEST_REGENERATE=0, or reuses a previous job's from the regeneration cache:
workers/jobs/regen_cache.py) -> capture hidden states (a stage of its own with the hf or
vllm backend: workers/jobs/capture_stage.py) -> train (resumable; checks for stop between
steps) -> export head -> benchmark -> publish under `S3OutputLocation/<job-name>/` ->
register the output SageMaker model.

The models/ modules that load torch (target, train, regenerate, train_launch) are imported
inside the stages that run them, so importing this module costs no torch.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from eaglenest.foundation.host.threads import (
    SHARING_ENV,
    ComputeLedger,
    ThreadPlan,
    apply_torch,
    plan_threads,
)
from eaglenest.foundation.shapes.optimization_jobs import CreateOptimizationJobRequest
from eaglenest.foundation.store.storage import ArtifactStore, StorageError
from eaglenest.models.data import encode_examples
from eaglenest.models.heads.registry import HEADS
from eaglenest.workers.infra.checkpoint_sync import CheckpointSync
from eaglenest.workers.infra.model_fetch import fetch_tree
from eaglenest.workers.jobs import capture_stage, job_data, job_target
from eaglenest.workers.jobs.bench_stage import BenchPlan, run_benchmark
from eaglenest.workers.jobs.capture_stage import CaptureInfo
from eaglenest.workers.jobs.control import JobControl
from eaglenest.workers.jobs.inputs import JobSources, fetch_data
from eaglenest.workers.jobs.options import (
    JobOptions,
    bench_decodings,
    for_kind,
    train_settings,
)
from eaglenest.workers.jobs.placing import JobGpus
from eaglenest.workers.jobs.progress import LOG_NAME, BenchProgress, TrainingProgress
from eaglenest.workers.jobs.publishing import publish_outputs
from eaglenest.workers.jobs.regen_cache import RegenCache
from eaglenest.workers.jobs.shard_cache import ShardCache
from eaglenest.workers.model_servers.process import default_backend
from eaglenest.workers.model_servers.schedule import schedule_from

log = logging.getLogger("eaglenest.optimize")
HEAD_FILES = ("config.json", "model.safetensors", "provenance.json")


@dataclass
class PipelineResult:
    head: str
    output_uri: str
    head_uri: str
    train: dict[str, Any]
    benchmark: dict[str, Any] | None = None
    #: the derived speculation schedule as its Environment value (None: no benchmark)
    schedule: str | None = None
    #: the serving backend the benchmark ran on (None: no benchmark)
    backend: str | None = None
    stages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Pipeline:
    name: str
    spec: CreateOptimizationJobRequest
    options: JobOptions
    sources: JobSources
    store: ArtifactStore
    work: Path
    control: JobControl
    #: where the job's child processes are recorded (foundation/host/children.py)
    children_dir: Path | None = None
    #: `<account>/<name>` (foundation/accounts.ResourceRef.local_key): what tells this job's
    #: processes apart from another account's job of the same name on this host
    key: str = ""
    #: the GPUs the job holds (workers/jobs/placing.py); none: the CPU
    gpus: JobGpus = field(default_factory=JobGpus)
    #: the host's budget of compute processes (foundation/host/threads.py compute_budget; 0: none)
    compute_budget: int = 0
    #: the account's EAGLENEST_MAX_STORED_BYTES (foundation/store/disk_usage.py; 0: none)
    max_stored_bytes: int = 0
    #: the host's linear-kernel timing cache for the benchmark's embedded servers
    kernels_dir: Path | None = None
    #: the capture backend chosen when the model is checked (capture_stage.choose_backend)
    capture_backend: str = "in-process"
    #: what `python -m` runs for the benchmark's vLLM servers (Settings.vllm_module)
    vllm_module: str = "vllm.entrypoints.openai.api_server"
    #: the dtype the target runs in, chosen then too (job_target.job_dtype): float32 on CPUs
    dtype: str = "float32"

    def stage(self, label: str) -> None:
        self.control.check()
        log.info("job %s: %s", self.name, label)
        self.control.report({"stage": label, "updated": time.time()})

    def run(self) -> PipelineResult:
        """The job; at its end the capture folder goes (capture_stage.discard)."""
        try:
            result = self._stages()
        except BaseException as exc:
            capture_stage.discard(self.work / capture_stage.CAPTURE_DIR,
                                  self.options.keep_capture, exc)
            raise
        capture_stage.discard(self.work / capture_stage.CAPTURE_DIR, False, None)
        return result

    def _stages(self) -> PipelineResult:
        self.stage("download model")
        model_dir = fetch_tree(self.store, self.sources.model_uri, self.work / "model")
        init_head = None
        if self.sources.head_uri:
            init_head = fetch_tree(self.store, self.sources.head_uri, self.work / "init_head")
        self.stage("check model files")
        from eaglenest.models.target import check_model_files, read_architecture

        check_model_files(model_dir)
        start = job_target.start_head(init_head)
        self.options = job_target.inherit(self.options, start)
        head_kind = job_target.check_head(self.options, read_architecture(model_dir)[1])
        self.options = for_kind(self.options, head_kind)  # a block head's K and layers
        self.stage("load data")
        examples = job_data.load(self.options, fetch_data(self.store, self.sources,
                                                         self.work / "data"))
        train_examples, holdout = job_data.split(examples, self.options.holdout, self.name)
        self.dtype, why = job_target.job_dtype(model_dir, self.options.dtype, self._device(),
                                               self.gpus.capability)
        if why:
            log.info("job %s: %s", self.name, why)
        self.capture_backend = capture_stage.choose_for(
            model_dir, self.options.capture_backend, self._device(), self.gpus.memory_gib,
            self.dtype)
        # a starting head's layers (a public DFlash head's may not be the default ones)
        target = job_target.load(model_dir, self.capture_backend, self._device(), self.dtype,
                                 start.aux_layer_ids if start else None)
        prompts = [job_data.prompt_text(e, target.tokenizer) for e in holdout]
        train_out = self._train(target, train_examples, head_kind, init_head, holdout)
        del target
        job_target.release()  # the benchmark's servers find its GPU memory free
        return self._finish(model_dir, head_kind, train_out, prompts)

    def _device(self, ranks: bool = False) -> str:
        """The job's own GPU or the CPU (workers/jobs/placing.py JobGpus.device)."""
        return self.gpus.device(self.options.device, ranks)

    def _regenerated(self, done: int, total: int) -> None:
        """Between regeneration batches: a progress line, and a stop ends the job here."""
        log.info("job %s: regenerated %d/%d assistant turns", self.name, done, total)
        self.control.check()

    def _regenerate(self, target: Any, examples: list[Any], holdout: list[Any], seed: int,
                    params: dict[str, Any], what: str) -> tuple[list[Any], list[Any]]:
        """The target rewrites every assistant turn (job_data.regenerate_both) with regenerate's
        ``params``, in a vLLM child when vLLM captures (workers/jobs/vllm_regenerate.py)."""
        self.stage(f"regenerate {what} with the target")
        if self.capture_backend == "vllm":
            from eaglenest.workers.jobs.vllm_regenerate import regenerate

            vllm = self._vllm(target)
            both = regenerate(examples + holdout, {**vllm.engine(), "seed": seed, **params},
                              self.work / "vllm-regenerate", self._regenerated,
                              check=self.control.check, children_dir=vllm.children_dir,
                              resource=vllm.resource, env=vllm.env)
            return job_data.split_regenerated(both, len(examples))
        with self._compute("regeneration"):
            return job_data.regenerate_both(target, examples, holdout, seed,
                                            self._regenerated, params)

    def _regeneration(self, target: Any, examples: list[Any], holdout: list[Any]
                      ) -> tuple[list[Any], list[Any], dict[str, Any]]:
        """(training, held-out, record): every answer the target's own, greedy, then
        EAGLENEST_REGENERATE_SAMPLES sampled answers of each training example added as
        training examples of their own (job_data.sample_passes); each pass is reused from
        the cache under S3OutputLocation when there (its record under ``samples``)."""
        seed, params = self.options.seed, job_data.REGEN_PARAMS
        cache = RegenCache(self.store, self.spec.OutputConfig.S3OutputLocation, self.name,
                           self.options.regenerate_cache,
                           capture_stage.regen_engine(self.capture_backend, self._device()),
                           params)
        train, held, record = cache.regenerate(target, examples, holdout, seed, self.stage,
                                               functools.partial(
                                                   self._regenerate, target, examples, holdout,
                                                   seed, params, "assistant turns"))
        for what, seed, params in job_data.sample_passes(self.options):
            more, _, done = replace(cache, params=params).regenerate(
                target, examples, [], seed, self.stage, functools.partial(
                    self._regenerate, target, examples, [], seed, params, what))
            train = train + more
            record.setdefault("samples", []).append({**done, "examples": len(more)})
        return train, held, record

    def _vllm(self, target: Any) -> capture_stage.VllmCapture:
        """The vLLM children's engine: the target over the job's GPUs (the CPU: one)."""
        return job_target.vllm_capture(Path(target.folder), self._device(), self.dtype,
                                       self.gpus, self.options.max_length + 8, self.work,
                                       self.children_dir, f"job:{self._key}")

    @contextlib.contextmanager
    def _compute(self, role: str) -> Iterator[ThreadPlan]:
        """Torch work in this process (regeneration, in-process training): admitted against
        the host's compute budget (else the job fails), counted in the host's compute ledger
        while it runs, on the thread plan that gives it its share of the CPUs."""
        compute = ComputeLedger()
        threads = plan_threads(compute.admit(1, self.compute_budget) + 1)
        log.info("job %s: %s for %s", self.name, threads.describe(), role)
        apply_torch(threads)
        with compute.entry(role, threads, key=self._key.replace("/", "-")):
            yield threads

    def _train(self, target: Any, examples: list[Any], head: str,
               init_head: Path | None, holdout: list[Any] | None = None) -> dict[str, Any]:
        from eaglenest.models.training.config import TrainConfig
        from eaglenest.models.training.train import latest_checkpoint, train

        holdout = holdout or []
        regeneration = None
        if self.options.regenerate:
            examples, holdout, regeneration = self._regeneration(target, examples, holdout)
        samples = encode_examples(examples, target.tokenizer, self.options.max_length)
        heldout = job_data.heldout_samples(target, holdout, self.options, self.name)
        data, capture = self._capture(target, samples, heldout)
        label = f"train {head} head on {len(samples)} samples"
        self.stage(label)
        out_dir = self.work / "train"
        sync = self.checkpoints()
        try:
            sync.restore(out_dir)  # another host's checkpoint, when this host has none
        except StorageError as exc:
            log.warning("job %s: could not restore the uploaded checkpoint: %s", self.name, exc)
        config = TrainConfig(
            head=head, out_dir=str(out_dir), max_steps=self.options.max_steps,
            batch_size=self.options.batch_size, lr=self.options.lr, seed=self.options.seed,
            draft_vocab_size=min(self.options.draft_vocab_size, target.vocab_size),
            num_layers=self.options.num_layers, checkpoint_every=self.options.checkpoint_every,
            seq_partitions=self.options.seq_partitions,
            resume=latest_checkpoint(out_dir) is not None,
            init_head=str(init_head) if init_head else None,
            checkpoint_format=HEADS[head].job_format,
            speculative_tokens=self.options.num_speculative_tokens, progress=False,
            should_stop=self.control.should_stop, on_checkpoint=sync.upload,
            eval_every=self.options.eval_every, plateau_evals=self.options.plateau_evals,
            max_seconds=self.options.max_train_minutes * 60 or None,
            **train_settings(self.options, head),
        )
        progress = TrainingProgress(
            self.name, label, config.max_steps, self.options.progress_every, self.store,
            self.output_base + LOG_NAME, self.work / "out" / LOG_NAME, self.control.report,
            budget_seconds=config.max_seconds)
        config.on_step = progress.row
        procs = self.options.train_processes or 1
        if procs > 1:
            running = ComputeLedger().admit(procs, self.compute_budget)  # else the job fails
            threads = plan_threads(running + procs)  # each rank: one share
            log.info("job %s: %s per training process", self.name, threads.describe())
            summary = self._train_processes(config, target, samples, procs, progress,
                                            threads.sharing, capture.folder, heldout)
        else:
            with self._compute("training") as threads:
                result = train(config, data, self._device())
            summary = {"steps": result.steps, "loss": result.loss,
                       "step_accuracy": result.step_accuracy,
                       "tokens_per_second": result.tokens_per_second,
                       "seconds": result.seconds, "history": result.history,
                       "stop_reason": result.stop_reason,
                       "heldout_accuracy": result.heldout_accuracy,
                       "heldout_step": result.heldout_step, "eval_seconds": result.eval_seconds}
        summary["threads"] = threads.to_dict()
        summary["regeneration"] = regeneration
        self.control.check()  # a stop during the last steps ends the job here
        progress.finish()
        (self.work / "out").mkdir(parents=True, exist_ok=True)
        self._record_capture(capture, data, summary)
        job_target.export(out_dir, self.dtype)  # the head as it serves; checkpoints: fp32
        with open(self.work / "out" / LOG_NAME, "w") as fh:
            for row in summary.pop("history"):
                fh.write(json.dumps(row) + "\n")
        return summary

    def _capture(self, target: Any, samples: list[Any],
                 heldout: list[Any]) -> tuple[Any, CaptureInfo]:
        """The training data: the live target with an in-process cache, or shards written
        by the capture stage (transformers here, or a vLLM child) and read without the
        target's decoder (the held-out samples, if any, are captured too, as their own
        split, and the held-out accuracy reads them from there)."""
        from eaglenest.models.capture.cache import CaptureCache
        from eaglenest.models.training.config import TrainConfig
        from eaglenest.models.training.shard_source import shard_train_data
        from eaglenest.models.training.train import TrainData

        if self.capture_backend == "in-process":
            weight = next(target.model.parameters())
            cache = CaptureCache(target, samples, TrainConfig.capture_cache_mb << 20,
                                 capture_stage.autocast(weight.device, weight.dtype))
            return (TrainData(target, samples, source=self._data_label(), cache=cache,
                              heldout=heldout), CaptureInfo("in-process"))
        self.stage(capture_stage.STAGE)
        vllm = self._vllm(target) if self.capture_backend == "vllm" else None
        shard_cache = ShardCache(self.store, self.spec.OutputConfig.S3OutputLocation,
                                 self.name, self.options.shard_cache)
        info = capture_stage.capture(self.work / capture_stage.CAPTURE_DIR, target, samples,
                                     self.options.capture_shard_samples, self.name,
                                     self.control.report, self.control.check, heldout, vllm,
                                     shard_cache if shard_cache.enabled else None)
        data = shard_train_data(info.folder or "", self._device(), source=self._data_label(),
                                heldout=bool(heldout))
        return data, info

    def _record_capture(self, info: CaptureInfo, data: Any, summary: dict[str, Any]) -> None:
        """The capture's record in the job's and the head's provenance.json; with
        EAGLENEST_KEEP_CAPTURE=1 the shards join the outputs (capture/)."""
        if info.backend == "in-process":
            info.bytes = getattr(data.cache, "used", None)
        elif self.options.keep_capture:
            capture_stage.keep(info, self.work / "out")
        summary["capture"] = info.record()
        head_prov = self.work / "train" / "provenance.json"
        if head_prov.is_file():
            record = json.loads(head_prov.read_text())
            record["capture"] = summary["capture"]
            head_prov.write_text(json.dumps(record, indent=2, default=str) + "\n")

    def _train_processes(self, config: Any, target: Any, samples: list[Any], procs: int,
                         progress: TrainingProgress, sharing: int,
                         capture: Path | None, heldout: list[Any]) -> dict[str, Any]:
        """Train in ``procs`` data-parallel processes (workers/jobs/train_launch.py); with
        a ``capture`` folder the ranks read the shards instead of loading the target. Every
        rank measures the ``heldout`` samples' accuracy, as one process would."""
        from eaglenest.workers.jobs.train_launch import launch, write_run

        self.stage(f"train in {procs} data-parallel processes (torchrun)")
        if next(target.model.parameters()).is_cuda:  # the ranks load their own copies
            target.model.to("cpu")
            job_target.release()  # rank 0's GPU is free of the parent's copy
        run = write_run(self.work / "ddp", config, Path(target.folder),
                        self._device(ranks=True), self._data_label(), samples, capture,
                        heldout, self.dtype, list(target.aux_layer_ids))
        summary = launch(run, procs, self.control.should_stop, config.on_checkpoint,
                         self.children_dir, f"job:{self._key}", on_row=progress.row,
                         env={SHARING_ENV: str(sharing), **self.gpus.env})
        summary["processes"] = procs
        return summary

    @property
    def _key(self) -> str:
        return self.key or self.name

    @property
    def output_base(self) -> str:
        return self.spec.OutputConfig.S3OutputLocation.rstrip("/") + f"/{self.name}/"

    def checkpoints(self) -> CheckpointSync:
        """Checkpoints mirrored under the output location, for resume on another host."""
        return CheckpointSync(self.store, self.output_base + "_checkpoints/")

    def _data_label(self) -> str:
        return self.sources.data_uri or f"builtin:{self.options.dataset or 'all'}"

    def _finish(self, model_dir: Path, head: str, train: dict[str, Any],
                prompts: list[str]) -> PipelineResult:
        self.stage("export head")
        out = self.work / "out"
        head_dir = out / "eagle_model"
        head_dir.mkdir(parents=True, exist_ok=True)
        for f in HEAD_FILES:
            if (self.work / "train" / f).exists():
                shutil.copy2(self.work / "train" / f, head_dir / f)
        bench = None
        if self.options.benchmark:
            label = "benchmark baseline vs EAGLE"
            self.stage(label)
            backend = self.options.backend or default_backend()
            plan = BenchPlan(model_dir, head_dir, prompts, backend, self.options.concurrency,
                             self.options.bench_max_tokens, self.options.num_speculative_tokens,
                             mode=HEADS[head].default_mode,
                             children_dir=self.children_dir, resource=f"job:{self._key}",
                             ks=self.options.measured_ks(), schedule_dir=head_dir,
                             rounds=self.options.bench_rounds,
                             max_rounds=self.options.bench_max_rounds,
                             minutes=self.options.bench_minutes,
                             decodings=bench_decodings(self.options, head, backend),
                             gpus=self.gpus.indexes,
                             gpu_env=self.gpus.env, held=self.gpus.held(),
                             kernel_cache=self.kernels_dir, vllm_module=self.vllm_module)
            # on the CPU its servers (the baseline and one per row) stay loaded together; on
            # GPUs one runs at a time (bench_stage.measure_rows)
            servers = 1 if self.gpus.indexes else 1 + len(plan.rows)
            ComputeLedger().admit(servers, self.compute_budget)
            bench = run_benchmark(plan, out, self.control.should_stop,
                                  BenchProgress(self.name, label, self.control.report))
        self.stage("upload outputs")
        (out / "provenance.json").write_text(json.dumps(
            {"job": self.name, "sources": self.sources.__dict__, "options":
             self.options.__dict__, "train": train}, indent=1, default=str))
        base = self.output_base
        publish_outputs(self.store, out, base, self.max_stored_bytes)
        self.checkpoints().clear()
        schedule = None
        if bench is not None:
            schedule = schedule_from(bench["schedule"], "benchmark").to_env()
        return PipelineResult(head=head, output_uri=base, head_uri=base + "eagle_model/",
                              train=train, benchmark=bench, schedule=schedule,
                              backend=bench.get("backend") if bench else None)
