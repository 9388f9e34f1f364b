"""Per-host linear-kernel choice (models/decode/kernels.py): forced candidates stay lossless,
the chooser follows injected timings, the timing cache is keyed, reused and self-healing."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from eaglenest.models.decode import SpeculativeEngine, generate, kernel_cache
from eaglenest.models.decode.kernels import (
    CANDIDATES,
    Candidate,
    KernelPolicy,
    TimingCase,
    choose,
    family_linears,
    round_calls,
)
from eaglenest.models.decode.onednn import OneDNNLinear

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
PROMPT = [5, 17, 33, 80, 9, 100]


class FakeTimer:
    """Milliseconds per (candidate, rows) from a table; counts the cases it timed."""

    def __init__(self, table: dict[tuple[str, int], float]) -> None:
        self.table, self.cases = table, []

    def __call__(self, cases: list[TimingCase]) -> list[list[float]]:
        for case in cases:
            self.cases.append((case.family, case.candidate, case.rows))
            case.run()  # the real linears run once: the case must be callable as built
        return [[self.table[(case.candidate, case.rows)]] for case in cases]


FAKES = {name: Candidate(name, True, lambda lin: True, lambda lin: lin) for name in ("a", "b")}
TIMES = {("a", 1): 1.0, ("a", 6): 10.0, ("b", 1): 2.0, ("b", 6): 4.0}


def fake_policy(timer: FakeTimer, **kw: object) -> KernelPolicy:
    return KernelPolicy(timer=timer, min_params=0, candidates=FAKES, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["plain", "chain"])
def test_forced_candidates_decode_like_stock(llama, make_head, mode: str) -> None:  # noqa: ANN001
    head = make_head(llama, "eagle3") if mode == "chain" else None
    engines = {name: SpeculativeEngine(llama, head, mode, k=3, kernels=KernelPolicy(force=name))
               for name in ("stock", "onednn")}
    assert engines["stock"].model is llama.model and engines["stock"].head is head
    assert any(type(m) is OneDNNLinear for m in engines["onednn"].model.modules())
    assert all(e.kernels.source == dict.fromkeys(e.kernels.choice, "forced")
               for e in engines.values())
    expect = engines["stock"].generate_ids(PROMPT, 16)
    assert engines["onednn"].generate_ids(PROMPT, 16) == expect


def test_bf16_only_where_allowed(llama) -> None:  # noqa: ANN001
    auto = SpeculativeEngine(llama, None, kernels=KernelPolicy(min_params=0))
    assert "bf16" not in auto.kernels.choice.values()  # lossless unless the caller allows it
    forced = SpeculativeEngine(llama, None, kernels=KernelPolicy(force="bf16"))
    packed = [m for m in forced.model.modules() if type(m) is OneDNNLinear]
    if kernel_cache.cpu_has_bf16():
        assert packed and all(m.compute_dtype == torch.bfloat16 for m in packed)
        assert len(forced.generate_ids(PROMPT, 8)) == 8
    else:  # no bf16 units: the forced candidate cannot run, stock stays
        assert not packed and set(forced.kernels.choice.values()) == {"stock"}


def test_chooser_takes_the_lower_weighted_score(llama) -> None:  # noqa: ANN001
    fams = family_linears(llama.model)
    plain = choose(fams, round_calls(1, 0, 1), fake_policy(timer := FakeTimer(TIMES)))
    assert plain.choice == {"layers": "a", "lm_head": "a"}  # 1 row: a (1 ms) beats b (2 ms)
    assert plain.source == {"layers": "measured", "lm_head": "measured"}
    assert {rows for _, _, rows in timer.cases} == {1}  # only the shapes it will run
    verify = choose(fams, round_calls(6, 5, 1), fake_policy(FakeTimer(TIMES)))
    assert verify.choice == {"layers": "b", "lm_head": "b"}  # 6 rows: b (4 ms) beats a (10)
    head = choose({"head": fams["layers"]}, round_calls(6, 10, 1), fake_policy(FakeTimer(TIMES)))
    assert head.calls["head"] == {1: 10.0, 6: 1.0}
    assert head.choice == {"head": "a"}  # 10 x 1 row + 1 x 6 rows: a 20 ms, b 24 ms
    assert any("score" in line for line in head.lines())


def test_untimed_when_small_or_forced(llama) -> None:  # noqa: ANN001
    timer = FakeTimer(TIMES)
    small = choose(family_linears(llama.model), round_calls(1, 0, 1),
                   KernelPolicy(timer=timer))  # the tiny target is under min_params
    assert small.choice == {"layers": "onednn", "lm_head": "onednn"} and not timer.cases
    assert set(small.source.values()) == {"untimed"}
    with pytest.raises(ValueError, match="unknown linear kernel"):
        choose({}, {}, KernelPolicy(force="fastest"))


def test_cache_written_reused_and_keyed(tmp_path: Path, llama) -> None:  # noqa: ANN001
    fams, calls = family_linears(llama.model), round_calls(1, 0, 1)
    first = FakeTimer(TIMES)
    choose(fams, calls, fake_policy(first, cache_dir=tmp_path, host="cpu A"))
    assert len(first.cases) == 4 and (tmp_path / kernel_cache.FILE_NAME).is_file()
    again = FakeTimer(TIMES)
    reused = choose(fams, calls, fake_policy(again, cache_dir=tmp_path, host="cpu A"))
    assert not again.cases and set(reused.source.values()) == {"cached"}
    assert reused.choice == {"layers": "a", "lm_head": "a"}
    other_host = FakeTimer(TIMES)
    choose(fams, calls, fake_policy(other_host, cache_dir=tmp_path, host="cpu B"))
    assert len(other_host.cases) == 4
    other_model = FakeTimer(TIMES)
    wider = {"layers": {"x": nn.Linear(8, 24)}}
    choose(wider, calls, fake_policy(other_model, cache_dir=tmp_path, host="cpu A"))
    assert len(other_model.cases) == 2  # new shapes: measured; lm_head not asked for
    head = {"head": fams["layers"]}  # a family's calls default to one 1-row call
    choose(head, round_calls(1, 0, 1), fake_policy(FakeTimer(TIMES), cache_dir=tmp_path, host="cpu A"))
    more_rows = FakeTimer(TIMES)
    choose(head, round_calls(6, 5, 1), fake_policy(more_rows, cache_dir=tmp_path, host="cpu A"))
    assert {rows for _, _, rows in more_rows.cases} == {6}  # 1 row came from the cache
    assert len(json.loads((tmp_path / kernel_cache.FILE_NAME).read_text())["entries"]) == 6
    assert kernel_cache.host_key().endswith(f"torch {torch.__version__} | {torch.get_num_threads()} threads")


@pytest.mark.parametrize("body", ["{not json", '{"version": 1, "entries": [1]}', "[]"])
def test_corrupt_cache_is_ignored_and_rewritten(tmp_path: Path, llama, body: str) -> None:  # noqa: ANN001
    (tmp_path / kernel_cache.FILE_NAME).write_text(body)
    timer = FakeTimer(TIMES)
    report = choose(family_linears(llama.model), round_calls(1, 0, 1),
                    fake_policy(timer, cache_dir=tmp_path, host="cpu A"))
    assert len(timer.cases) == 4 and report.choice["layers"] == "a"
    assert kernel_cache.load(tmp_path)  # rewritten in the current format


def test_registry_names_every_candidate() -> None:
    assert list(CANDIDATES) == ["stock", "onednn", "bf16"]
    assert [c.lossless for c in CANDIDATES.values()] == [True, True, False]


def test_cli_explain_and_env(tiny_dir, capsys, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("EAGLENEST_LINEAR_KERNEL", "stock")
    parser = argparse.ArgumentParser()
    generate.register(parser.add_subparsers())
    args = parser.parse_args(["generate", "--target", str(tiny_dir("LlamaForCausalLM")),
                              "--prompt", "hi", "--max-new-tokens", "3", "--explain",
                              "--kernel-cache", ""])
    assert args.linear_kernel == "stock" and args.func(args) == 0
    out = capsys.readouterr().out
    assert "linear kernels: layers=stock (forced), lm_head=stock (forced)" in out
    assert "target forward: direct" in out
    forced = parser.parse_args(["generate", "--target", "t", "--prompt", "p",
                                "--linear-kernel", "onednn"])
    assert generate.kernel_policy(forced).force == "onednn"


def test_busy_host_measures_again_and_is_not_cached(tmp_path: Path, llama) -> None:  # noqa: ANN001
    passes = []

    def busy_timer(cases: list[TimingCase]) -> list[list[float]]:  # median 3x the fastest
        passes.append(len(cases))
        return [[1.0, 3.0, 3.0] if case.candidate == "a" else [2.0] for case in cases]

    fams = {"layers": family_linears(llama.model)["layers"]}
    policy = KernelPolicy(timer=busy_timer, min_params=0, candidates=FAKES, cache_dir=tmp_path,
                          host="cpu A", passes=2)
    report = choose(fams, round_calls(1, 0, 1), policy)
    assert len(passes) == 2 and report.source == {"layers": "measured, busy"}
    assert report.choice == {"layers": "a"}  # the fastest call counts: 1 ms against 2 ms
    assert not (tmp_path / kernel_cache.FILE_NAME).exists()  # a busy measurement is not kept


def test_choice_and_timings_are_logged(llama, caplog) -> None:  # noqa: ANN001
    with caplog.at_level("INFO", logger="eaglenest.models.decode.kernels"):
        choose(family_linears(llama.model), round_calls(1, 0, 1), fake_policy(FakeTimer(TIMES)))
    assert "layers=a (measured; ms/round: a 1.00, b 2.00)" in caplog.text


def test_in_place_replaces_the_callers_linears(llama) -> None:  # noqa: ANN001
    import copy

    model = copy.deepcopy(llama.model)  # own copy: the session fixture stays stock
    policy = KernelPolicy(force="onednn", in_place=True)
    engine = SpeculativeEngine(model, None, kernels=policy)
    assert engine.model is model and not any(type(m) is nn.Linear for m in model.modules())
    assert engine.generate_ids(PROMPT, 8) == SpeculativeEngine(llama, None).generate_ids(PROMPT, 8)


def test_a_fused_target_is_timed_as_it_runs(tmp_path: Path, llama) -> None:  # noqa: ANN001
    """A repacking candidate on a fused target is timed over the fused sibling groups (one
    call for q/k/v, one for gate/up), under a cache key of its own; the others per linear."""
    built: dict[str, list[int]] = {"keep": [], "pack": []}

    def recorder(name: str) -> Callable[[nn.Linear], nn.Module]:
        def build(lin: nn.Linear) -> nn.Module:
            built[name].append(lin.out_features)
            return lin
        return build

    cands = {"keep": Candidate("keep", True, lambda lin: True, recorder("keep")),
             "pack": Candidate("pack", True, lambda lin: True, recorder("pack"), repacks=True)}
    timer = FakeTimer({("keep", 1): 2.0, ("pack", 1): 1.0})
    policy = KernelPolicy(timer=timer, min_params=0, candidates=cands, cache_dir=tmp_path,
                          host="cpu A", sample_params=10**12)  # sample: every unit
    layers = {"layers": family_linears(llama.model)["layers"]}
    attn = llama.model.model.layers[0].self_attn
    qkv = attn.q_proj.out_features + attn.k_proj.out_features + attn.v_proj.out_features
    n_layers = len(llama.model.model.layers)
    report = choose(layers, round_calls(1, 0, 1), policy, fused=frozenset({"layers"}))
    assert report.choice == {"layers": "pack"}
    assert len(built["keep"]) == 7 * n_layers  # q k v o gate up down, one call each
    assert len(built["pack"]) == 4 * n_layers and built["pack"].count(qkv) == n_layers
    unfused = choose(layers, round_calls(1, 0, 1), policy)  # the same shapes, not fused
    assert unfused.source == {"layers": "measured"}  # not the fused timings' cache entry
    keys = json.loads((tmp_path / kernel_cache.FILE_NAME).read_text())["entries"]
    assert sorted(k.split(" | ")[1].split()[0] for k in keys) == ["layers", "layers+fused"]


def test_the_engine_times_its_target_fused(tmp_path: Path, llama) -> None:  # noqa: ANN001
    def families(fuse: bool) -> list[str]:
        timer = FakeTimer({("stock", 1): 2.0, ("onednn", 1): 1.0})
        folder = tmp_path / str(fuse)
        engine = SpeculativeEngine(llama, None, kernels=KernelPolicy(
            timer=timer, min_params=0, cache_dir=folder, host="cpu A", fuse=fuse))
        assert engine.kernels.choice["layers"] == "onednn"
        assert (engine.kernels.fused > 0) == fuse
        keys = json.loads((folder / kernel_cache.FILE_NAME).read_text())["entries"]
        return sorted(k.split(" | ")[1].split()[0] for k in keys)

    assert families(True) == ["layers+fused", "lm_head"]
    assert families(False) == ["layers", "lm_head"]
