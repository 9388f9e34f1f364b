"""``eaglenest generate``: decode a prompt with an optional draft head and report speed.

    eaglenest generate --target DIR [--head DIR] --prompt TEXT [--mode chain|tree|parallel|block]
                       [--k N] [--adaptive] [--max-new-tokens N] [--temperature T]
                       [--linear-kernel auto|stock|onednn|bf16] [--allow-bf16] [--explain]

The linear kernels are chosen per host at load (models/decode/kernels.py); the choice is
forced by ``--linear-kernel`` or, where that is not given, ``EAGLENEST_LINEAR_KERNEL``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglenest.models.decode.modes import SPECULATIVE_MODES, DecodeMode

if TYPE_CHECKING:  # torch is imported when a command runs, not when it is parsed
    from eaglenest.models.decode.engine import SpeculativeEngine
    from eaglenest.models.decode.kernels import KernelPolicy


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("generate", help="generate text with speculative decoding")
    p.add_argument("--target", required=True, help="target model folder")
    p.add_argument("--head", default=None,
                   help="draft head folder (default: none, plain decoding)")
    p.add_argument("--prompt", required=True, help="text to continue (or ask, with --chat)")
    p.add_argument("--mode", choices=SPECULATIVE_MODES, default=None,
                   help="drafting: chain, EAGLE-2 dynamic tree, P-EAGLE parallel or DFlash "
                        "block (default: the head's own mode, HeadSpec.default_mode)")
    p.add_argument("--k", type=int, default=4, help="drafts per step (tree: depth)")
    p.add_argument("--topk", type=int, default=4, help="tree branching")
    p.add_argument("--total-tokens", type=int, default=16, help="tree size after rerank")
    p.add_argument("--adaptive", action="store_true", help="adapt K / depth online")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    p.add_argument("--seed", type=int, default=None,
                   help="sampling seed (default: none, not reproducible)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="weights and activations")
    p.add_argument("--linear-kernel", default=os.environ.get("EAGLENEST_LINEAR_KERNEL", "auto"),
                   help="auto (timed per host at load) or one candidate of "
                        "models/decode/kernels.py: stock, onednn, bf16 "
                        "(default: $EAGLENEST_LINEAR_KERNEL, else auto)")
    p.add_argument("--no-onednn", action="store_true", help="same as --linear-kernel stock")
    p.add_argument("--allow-bf16", action="store_true",
                   help="let auto pick bfloat16 linears where the CPU has bf16 units (lossy)")
    p.add_argument("--kernel-cache", default=None,
                   help="folder of the kernel timing cache (default: $EAGLENEST_CACHE/kernels, "
                        "else ~/.cache/eaglenest/kernels; empty: measure every time)")
    p.add_argument("--explain", action="store_true",
                   help="print the linear-kernel choice and its timings")
    p.set_defaults(func=cmd_generate)


def build_engine(args: argparse.Namespace) -> tuple[SpeculativeEngine, Any]:
    """(engine, tokenizer) from the CLI arguments."""
    import torch

    from eaglenest.models.checkpoint import load_head
    from eaglenest.models.decode.engine import SpeculativeEngine
    from eaglenest.models.heads.registry import head_spec
    from eaglenest.models.target import load_target

    dtype = getattr(torch, args.dtype)
    target = load_target(args.target, dtype=dtype)
    head = None
    if args.head:
        head = load_head(args.head, target.embed_weight(), target.lm_head_weight()).to(dtype)
    mode = DecodeMode(args.mode) if args.mode else (
        head_spec(head).default_mode if head is not None else DecodeMode.PLAIN)
    engine = SpeculativeEngine(
        target,
        head,
        mode,
        k=args.k,
        depth=args.k,
        topk=args.topk,
        total_tokens=args.total_tokens,
        adaptive=args.adaptive,
        kernels=kernel_policy(args),
    )
    return engine, target.tokenizer


def kernel_policy(args: argparse.Namespace) -> KernelPolicy:
    from eaglenest.models.decode.kernels import KernelPolicy
    from eaglenest.models.prepare import CACHE

    folder = CACHE / "kernels" if args.kernel_cache is None else args.kernel_cache
    return KernelPolicy(
        force="stock" if args.no_onednn else args.linear_kernel,
        lossy=args.allow_bf16,
        cache_dir=Path(folder) if folder else None,
    )


def encode_prompt(tokenizer: Any, text: str, chat: bool) -> list[int]:
    if chat:
        messages = [{"role": "user", "content": text}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # BatchEncoding too
    return list(tokenizer(text)["input_ids"])


def cmd_generate(args: argparse.Namespace) -> int:
    engine, tok = build_engine(args)
    if args.explain:
        print("\n".join(engine.kernels.lines()))
        print(f"target forward: {engine.forward_kind()}")
    prompt = encode_prompt(tok, args.prompt, args.chat)
    stop = [tok.eos_token_id] if tok.eos_token_id is not None else []
    started = time.perf_counter()
    out: list[int] = []
    for chunk in engine.generate(
        prompt, args.max_new_tokens, args.temperature, args.top_p, stop, args.seed
    ):
        out.extend(chunk)
    elapsed = time.perf_counter() - started
    st = engine.request_stats
    print(tok.decode(out, skip_special_tokens=True))
    print(
        f"[{engine.mode.value}] {len(out)} tokens in {elapsed:.2f}s = "
        f"{len(out) / max(elapsed, 1e-9):.1f} tok/s; acceptance length {st.acceptance_length:.2f} "
        f"(drafts {st.num_drafts}, accepted {st.num_accepted_tokens}/{st.num_draft_tokens})"
    )
    if engine.note:
        print(f"note: {engine.note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eaglenest-decode")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
