"""benchmarks/decode.py's oracle rows on the tiny random Llama target: chain K drafting
plain decoding's own output accepts every draft (tau = K + 1, but for a prompt's last,
partial round), emits what plain does, and the summary's ``best / oracle`` divides our
fastest other row by the fastest oracle row."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import decode
from benchmarks.oracle import OracleSource
from eaglenest.models.data.template import Sample
from eaglenest.models.target import Target, load_target

ALIGNED = 13  # new tokens: 1 from the prefill + 12, whole rounds of K + 1 for K = 2 and 3
TEXTS = {"chat": ["The quick brown fox jumps over", "please write a function that sorts"],
         "code": ["def add(a, b):\n    return"]}  # none reaches the stop token in 16 tokens
STOPS = "Natalia sold 48 clips in April"  # reaches it after one token


@pytest.fixture(scope="module")
def target(tiny_llama_dir: Path) -> Target:
    torch.set_num_threads(2)
    return load_target(tiny_llama_dir)


@pytest.fixture(scope="module")
def head(target: Target) -> Any:
    """A random (untrained) EAGLE-3 head: the oracle rows do not use it, the others do."""
    from eaglenest.models.heads.registry import HEADS
    from eaglenest.models.training.config import TrainConfig

    rng = random.Random(0)
    vocab = int(target.model.config.vocab_size)
    samples = [Sample([rng.randrange(vocab) for _ in range(64)], [0] * 4 + [1] * 60)
               for _ in range(2)]
    torch.manual_seed(0)
    return HEADS["eagle3"].build(target, samples, TrainConfig(head="eagle3",
                                                              draft_vocab_size=64)).eval()


def ids(target: Target, text: str) -> list[int]:
    return list(target.tokenizer(text, add_special_tokens=False)["input_ids"])


def args(new_tokens: int) -> Any:
    return decode.parse_args(["--head", "unused", "--ks", "2,3", "--more-trees", "",
                              "--depth", "3", "--topk", "2", "--total-tokens", "6",
                              "--max-new-tokens", str(new_tokens)])


def test_oracle_rows_reach_k_plus_one_and_emit_plain(target: Target, head: Any) -> None:
    """Whole rounds only (13 new tokens, no stop token reached): every round accepts all K
    drafts, so tau is exactly K + 1; the summary names the best row and the best oracle."""
    rows = decode.in_process(target, head, [],
                             {k: [ids(target, t) for t in v] for k, v in TEXTS.items()},
                             args(ALIGNED))
    by = {(r.prompt_set, r.name): r for r in rows}
    for set_name in ("chat", "code"):
        plain = by[(set_name, "ours plain")]
        assert all(len(o) == ALIGNED for o in plain.outputs)  # no early stop: whole rounds
        for k in (2, 3):
            oracle = by[(set_name, f"ours chain K={k} oracle")]
            assert oracle.tau == k + 1
            assert oracle.outputs == plain.outputs and oracle.differ == 0
    ceilings = {c["prompt_set"]: c for c in decode.ceilings(rows)}
    assert set(ceilings) == {"chat", "code"}
    for set_name, c in ceilings.items():
        ours = [r for r in rows if r.prompt_set == set_name and r.name.startswith("ours ")]
        others = [r.tokens_per_second for r in ours if not r.name.endswith(" oracle")]
        oracles = [r.tokens_per_second for r in ours if r.name.endswith(" oracle")]
        assert not c["best"].endswith(" oracle") and c["oracle"].endswith(" oracle")
        assert c["best_tps"] == max(others) and c["oracle_tps"] == max(oracles)
        assert c["best_over_oracle"] == pytest.approx(max(others) / max(oracles))
    table = decode.markdown(rows, [])
    assert "| best / oracle |" in table and f"| {ceilings['code']['oracle']} |" in table


@pytest.mark.parametrize("new_tokens", [12, 16])
def test_only_the_last_round_may_reject(target: Target, head: Any, new_tokens: int) -> None:
    """Any length, a stop token too: the rows' own functions, prompt by prompt. Every round
    but the last accepts all K drafts: the request takes the fewest rounds, ceil((n - 1) /
    (K + 1)) for n new tokens; the last round's drafts past the known output may fail."""
    eos = target.tokenizer.eos_token_id
    oracle = OracleSource(end=eos)
    opts = args(new_tokens)
    engines = decode.engine_rows(target, head, [], opts, oracle)
    fns = {name: decode.engine_fn(e, new_tokens, eos)
           for name, e in engines.items()}
    stopped, no_tau = fns["ours plain"](ids(target, STOPS))
    assert no_tau is None and stopped[-1] == eos and len(stopped) < new_tokens
    for text in [*TEXTS["chat"], *TEXTS["code"], STOPS]:
        prompt = ids(target, text)
        plain, _ = fns["ours plain"](prompt)
        oracle.load(prompt + plain)
        for k in opts.ks:
            out, stats = fns[f"ours chain K={k} oracle"](prompt)
            assert out == plain and stats is not None
            rounds = math.ceil((len(out) - 1) / (k + 1))
            assert stats.num_drafts == rounds
            assert stats.num_accepted_tokens >= k * (rounds - 1)
            assert len(stats.accepted_per_pos) == k
            assert all(n >= rounds - 1 for n in stats.accepted_per_pos)
