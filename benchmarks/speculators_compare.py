"""Our EAGLE-3 head vs the speculators library's (vllm-project), same data, same steps, on CPU.

    python -m benchmarks.speculators_compare --steps N [--out DIR] [--json PATH]
                                             [--venv /work/specvenv]

Issue #3: train the same head with speculators 0.9.0 and report both acceptance lengths.

* Target: SmolLM2-135M-Instruct (``benchmarks.train_heads.prepared_target``).
* Data: the built-in datasets split as ``train_heads --data builtin`` (``split_builtin``,
  ``--held-out`` examples of each file are evaluation prompts, never trained on),
  original assistant turns. The training examples are written once to ``OUT/train.jsonl``;
  our encoder (chat template, assistant-only loss mask, ``--max-length`` 512) turns them
  into (input_ids, loss_mask) rows and *both* trainers consume exactly those rows.
  speculators gets them as pre-tokenized rows (its prepare-data would otherwise need a vLLM
  render server); see benchmarks/speculators_cpu/prepare_data.py.
* Heads: 1 decoder layer, aux layers = our target's (2, 15, 27), draft vocabulary 8192 by
  training-token frequency (both libraries use the same rule; the report says whether the
  two vocabularies came out identical). Each library keeps its own recipe otherwise:
  ours = ``head_bench.train_config("eagle3")`` (TrainConfig's recipe: Muon for the draft
  layer's matrices + AdamW wd 0.01 for the rest, lr 1e-3, 20 warm-up steps, cosine, 3 TTT
  steps weighted equally, norm_before_fc / norm_output / norm_before_residual, fp32);
  speculators = its defaults (Muon + AdamW 1e-3, linear schedule, KL loss, the same three
  norms) except fp32 hidden states.
* Token budget: speculators packs samples into one ``--max-length`` sequence per step; we
  do not pack, so our batch size is chosen (unless ``--batch-size``) as the speculators run's
  mean real tokens per step / our mean sample length. Tokens per step and tokens seen are
  reported for both. Target hidden states are computed before the timed training for both
  (their offline hidden-state files, our capture cache) and reported separately.
* tau: vLLM (``train_heads.measure_tau``), K = 3 and 5, temperature 0, held-out prompts.
  vLLM 0.32 serves the speculators checkpoint as written: ``speculators_model_type``
  "eagle3" goes through vllm/transformers_utils/configs/speculators (norm_before_fc,
  norm_output and norm_before_residual are honoured by llama_eagle3.py); its bf16
  ``embed_tokens`` copy is loaded as the draft's own embedding; ``layer_types:
  ["sliding_attention"]`` with ``sliding_window`` 2048 equals full attention at
  max_model_len 2048.

speculators runs in its own venv through benchmarks/speculators_cpu/*.py. Setup (torchvision
and torchaudio are left out on purpose: speculators lists them, training never imports them):

    python3.11 -m venv /work/specvenv
    /work/specvenv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    /work/specvenv/bin/pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
    /work/specvenv/bin/pip install aiohttp click datasets==5.1.0 httpx huggingface-hub \
        loguru==0.7.3 numpy==2.4.6 openai==3.54.0 protobuf psutil pydantic==2.14.3 \
        pydantic-settings==2.16.3 rich safetensors tqdm==4.70.1 transformers==5.19.0 \
        typer==0.29.2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from safetensors.torch import load_file

from benchmarks.head_bench import first_user_prompt, split_builtin, train_config
from benchmarks.train_heads import _cpu_seconds, measure_tau, prepared_target
from eaglenest.models.capture.cache import CaptureCache
from eaglenest.models.checkpoint import save_head
from eaglenest.models.data import Chat, Example, Sample, encode_examples, load_examples
from eaglenest.models.heads.registry import EAGLE3
from eaglenest.models.heads.vocab import build_draft_vocab, token_counts
from eaglenest.models.target import Target, load_target
from eaglenest.models.training.train import TrainData, train
from eaglenest.workers.model_servers.process import ServingError

SCRIPTS = Path(__file__).resolve().parent / "speculators_cpu"


@dataclass
class Row:
    head: str
    steps: int
    tokens_per_step: float
    tokens_seen: int
    train_wall_s: float
    train_cpu_s: float
    hidden_states_s: float  # target hidden states, computed before training (wall)
    batch: str
    checkpoint: str
    tau: dict[int, float | None] = field(default_factory=dict)
    accepted_per_position: dict[int, list[float]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)  # K -> why vLLM gave no tau


# ---- data ------------------------------------------------------------------------------------
def write_examples(path: Path, examples: list[Example]) -> Path:
    """One JSONL record per example: chats as ``messages``, completions as prompt/completion."""
    lines = [json.dumps({"messages": e.messages} if isinstance(e, Chat)
                        else {"prompt": e.prompt, "completion": e.completion})
             for e in examples]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_rows(path: Path, samples: list[Sample]) -> Path:
    path.write_text("".join(json.dumps({"input_ids": s.input_ids, "loss_mask": s.loss_mask})
                            + "\n" for s in samples))
    return path


def draft_vocab(target: Target, samples: list[Sample], size: int) -> np.ndarray:
    """Our d2t (models.training.train builds the head's vocabulary the same way)."""
    seqs = ([t for t, m in zip(s.input_ids, s.loss_mask, strict=True) if m] for s in samples)
    d2t, _ = build_draft_vocab(token_counts(seqs, target.vocab_size), size)
    return d2t.numpy()


# ---- speculators (venv subprocesses) ---------------------------------------------------------
def venv_run(args: argparse.Namespace, script: str, argv: list[str], log: Path) -> dict[str, Any]:
    """Run SCRIPTS/script in the venv (log to ``log``); the last JSON line it printed."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [str(args.venv / "bin" / "python"), str(SCRIPTS / script), *argv]
    with log.open("w") as fh:
        fh.write(" ".join(cmd) + "\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"{script} failed ({proc.returncode}); tail of {log}:\n{text[-3000:]}")
    last = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(last[-1]) if last else {}


def spec_train_argv(args: argparse.Namespace, target_dir: Path, data: Path, ratio: float,
                    aux: list[int]) -> list[str]:
    return ["--verifier-name-or-path", str(target_dir), "--data-path", str(data),
            "--speculator-type", str(EAGLE3.speculators_type), "--num-layers", "1",
            "--target-layer-ids", *map(str, aux), "--draft-vocab-size", str(args.draft_vocab),
            "--total-seq-len", str(args.max_length), "--max-steps", str(args.steps),
            "--train-data-ratio", f"{ratio:.6f}", "--hidden-states-dtype", "float32",
            "--loss-implementation", "eager", "--draft-attn-impl", "sdpa",
            "--num-workers", "0", "--on-missing", "raise", "--seed", "0", "--log-freq", "10",
            "--save-path", str(args.out / "spec" / "ckpt"), "--no-resume-from-checkpoint"]


def reused_speculators(report: Path, steps: int) -> tuple[Row, Path]:
    """The speculators row of an earlier report (same data and steps); tau is measured again.

    speculators' run is deterministic given the rows and its seed, so an unchanged library
    and data need not be retrained to try another recipe of ours.
    """
    rows = json.loads(report.read_text())["rows"]
    row = Row(**{k: v for k, v in next(r for r in rows if r["head"].startswith("speculators"))
                 .items() if k not in ("tau", "accepted_per_position", "errors")})
    if row.steps != steps or not Path(row.checkpoint).is_dir():
        raise SystemExit(f"{report}: speculators ran {row.steps} steps (asked {steps}) or "
                         f"its checkpoint {row.checkpoint} is gone; run without --reuse")
    return row, Path(row.checkpoint)


def run_speculators(args: argparse.Namespace, target: Target, samples: list[Sample],
                    held: list[Sample]) -> tuple[Row, Path]:
    work = args.out / "spec"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tdir, data = str(target.folder), work / "data"
    rows = venv_run(args, "prepare_data.py", [
        tdir, str(write_rows(work / "train_rows.jsonl", samples)),
        str(write_rows(work / "held_out_rows.jsonl", held)), str(data),
        "--seq-length", str(args.max_length)], work / "prepare.log")
    hs = venv_run(args, "gen_hidden_states.py", [
        tdir, str(data), "--layers", ",".join(map(str, target.aux_layer_ids)),
        "--threads", str(args.threads), "--rows", str(rows["train_rows"])], work / "hidden.log")
    ratio = (rows["train_rows"] + 0.5) / (rows["train_rows"] + rows["val_rows"])
    argv = spec_train_argv(args, target.folder or Path(tdir), data, ratio,
                           list(target.aux_layer_ids))
    venv_run(args, "train_cpu.py", ["--stats", str(work / "train_stats.json"),
                                    "--threads", str(args.threads), *argv], work / "train.log")
    stats = json.loads((work / "train_stats.json").read_text())
    step_tokens = stats["step_tokens"]
    row = Row("speculators eagle3", stats["steps"], sum(step_tokens) / len(step_tokens),
              sum(step_tokens), stats["loop_wall_s"], stats["loop_cpu_s"], hs["wall_s"],
              f"1 packed seq <= {args.max_length} tok", stats["checkpoint"])
    return row, Path(stats["checkpoint"])


# ---- ours --------------------------------------------------------------------------------------
def run_ours(args: argparse.Namespace, target: Target, samples: list[Sample],
             batch: int) -> tuple[Row, Path]:
    data = TrainData(target, samples, "builtin")
    data.cache = CaptureCache(target, samples, 8 << 30)
    t0 = time.perf_counter()
    for i in range(len(samples)):  # the target pass, before the timed training
        data.cache.entry(i, torch.device("cpu"))
    capture_s = time.perf_counter() - t0
    config = train_config(EAGLE3.kind, max_steps=args.steps, batch_size=batch,
                          draft_vocab_size=args.draft_vocab)
    cpu0 = _cpu_seconds()
    result = train(config, data)
    cpu = _cpu_seconds() - cpu0
    head_dir = save_head(result.head.eval(), args.out / "ours" / EAGLE3.kind,
                         verifier=str(target.folder))
    tokens = round(result.tokens_per_second * result.seconds)
    row = Row("ours eagle3", result.steps, tokens / max(result.steps, 1), tokens,
              result.seconds, cpu, capture_s, f"{batch} samples, right-padded", str(head_dir))
    return row, head_dir


def auto_batch(spec_tokens_per_step: float, samples: list[Sample]) -> int:
    mean_len = sum(len(s.input_ids) for s in samples) / len(samples)
    return max(1, round(spec_tokens_per_step / mean_len))


# ---- report ------------------------------------------------------------------------------------
def table(rows: list[Row], ks: list[int]) -> str:
    head = ("| head | steps | batch | tokens/step | tokens seen | train wall s | train CPU s | "
            "hidden states s | " + " | ".join(f"tau K={k}" for k in ks) + " |")
    lines = [head, "|" + "---|" * (8 + len(ks))]
    for r in rows:
        taus = " | ".join(f"{r.tau[k]:.3f}" if r.tau.get(k) else "-" for k in ks)
        lines.append(f"| {r.head} | {r.steps} | {r.batch} | {r.tokens_per_step:.0f} | "
                     f"{r.tokens_seen} | {r.train_wall_s:.0f} | {r.train_cpu_s:.0f} | "
                     f"{r.hidden_states_s:.0f} | {taus} |")
    return "\n".join(lines)


def measure_all(args: argparse.Namespace, target_dir: Path, heads: list[tuple[Row, Path]],
                prompts: list[str], ks: list[int]) -> None:
    for row, head_dir in heads:
        for k in ks:
            log = args.out / f"{row.head.split()[0]}-k{k}.log"
            try:
                row.tau[k], row.accepted_per_position[k] = measure_tau(
                    target_dir, head_dir, k, prompts, args.eval_tokens, log)
            except (ServingError, httpx.HTTPError) as exc:  # keep going: report why
                row.tau[k], row.errors[k] = None, f"{type(exc).__name__}: {exc}"[-2000:]
            print(f"{row.head} K={k}: tau {row.tau[k]} {row.errors.get(k, '')}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--steps", type=int, required=True, help="optimizer steps for each head")
    p.add_argument("--out", type=Path, default=Path("/work/runs/spec_compare"))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--venv", type=Path, default=Path("/work/specvenv"))
    p.add_argument("--batch-size", type=int, default=0,
                   help="our batch size; 0: match speculators' tokens per step")
    p.add_argument("--ks", default="3,5")
    p.add_argument("--held-out", type=int, default=2, help="examples held out per dataset")
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--draft-vocab", type=int, default=train_config(EAGLE3.kind).draft_vocab_size)
    p.add_argument("--eval-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=max(1, torch.get_num_threads()))
    p.add_argument("--reuse-speculators", type=Path, default=None, metavar="REPORT",
                   help="take the speculators head and its figures from an earlier report.json "
                   "(same data and --steps) instead of training it again")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    target_dir = prepared_target()
    target = load_target(target_dir)
    train_ex, eval_ex = split_builtin(args.held_out)
    chats = load_examples(write_examples(args.out / "train.jsonl", train_ex))
    samples = encode_examples(chats, target.tokenizer, args.max_length)
    held = encode_examples(eval_ex, target.tokenizer, args.max_length)
    prompts = [first_user_prompt(e, target) for e in eval_ex]
    print(f"{len(samples)} training samples ({sum(len(s.input_ids) for s in samples)} tokens, "
          f"{sum(sum(s.loss_mask) for s in samples)} loss tokens), {len(prompts)} held-out "
          "prompts", flush=True)
    if args.reuse_speculators:
        spec_row, spec_dir = reused_speculators(args.reuse_speculators, args.steps)
    else:
        spec_row, spec_dir = run_speculators(args, target, samples, held)
    batch = args.batch_size or auto_batch(spec_row.tokens_per_step, samples)
    ours_row, ours_dir = run_ours(args, target, samples, batch)
    ks = [int(k) for k in args.ks.split(",")]
    measure_all(args, target_dir, [(ours_row, ours_dir), (spec_row, spec_dir)], prompts, ks)
    rows = [ours_row, spec_row]
    spec_d2t = load_file(str(spec_dir / "model.safetensors"))["d2t"].numpy()
    same_vocab = bool(np.array_equal(spec_d2t, draft_vocab(target, samples, args.draft_vocab)))
    print(table(rows, ks))
    for r in rows:
        for k, err in r.errors.items():
            print(f"{r.head} K={k}: vLLM gave no tau: {err}")
    print(f"identical draft vocabularies: {same_vocab}; threads: {args.threads}")
    report = {"rows": [asdict(r) for r in rows], "identical_draft_vocab": same_vocab,
              "threads": args.threads,
              "training_samples": len(samples), "held_out_prompts": len(prompts)}
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
