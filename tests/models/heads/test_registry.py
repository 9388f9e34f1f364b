"""The head registry is the one place that knows the head kinds: every spec builds, saves
and reloads its own kind, and no kind string is written anywhere else outside tests/."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from eaglenest.models.checkpoint import build_config, load_head, read_head_config, save_head
from eaglenest.models.heads.registry import (
    HEADS,
    KINDS,
    find_head_spec,
    head_spec,
    spec_of_config,
    vllm_speculative_method,
)
from eaglenest.models.training.config import TrainConfig
from tests.support import sources

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = Path("models/heads/registry.py")
#: (file, kind string) -> why the literal stays
ALLOWED: dict[tuple[Path, str], str] = {}


def python_files() -> list[Path]:
    """Every .py file outside tests/ (tests/support/sources.py)."""
    return sources.python_files(skip=frozenset({"tests"}))


def kind_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are exactly a head kind: compared with one (``kind ==
    "peagle"``), listed (``("eagle", "eagle3")``), passed, returned or used as a key. Prose
    that mentions a kind (docstrings, messages, file names) is never exactly equal."""
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in KINDS)


def test_the_scan_sees_the_code_and_the_registry():
    files = python_files()
    assert REGISTRY in files
    assert {f.parts[0] for f in files} >= {"models", "workers", "api", "benchmarks"}
    assert kind_literals(ast.parse((ROOT / REGISTRY).read_text()))  # the kinds live there


def test_the_scan_catches_kind_literals_and_ignores_prose():
    code = ('"""A P-EAGLE head ("peagle") drafts in parallel."""\n'
            'if kind == "peagle":\n    pass\n'
            'HEADS = ("eagle", "eagle3")\n'
            'TrainConfig(head="eagle3")\n'
            'log = "eagle-server.log"\n'
            'msg = f"EAGLENEST_HEAD=eagle: {kind}"\n'
            'def f():\n    return "eagle"\n')
    assert kind_literals(ast.parse(code)) == [
        (2, "peagle"), (4, "eagle"), (4, "eagle3"), (5, "eagle3"), (9, "eagle")]


def test_no_head_kind_literal_outside_the_registry():
    offenders = []
    for rel in python_files():
        if rel == REGISTRY:
            continue
        for line, value in kind_literals(ast.parse((ROOT / rel).read_text(), str(rel))):
            if (rel, value) not in ALLOWED:
                offenders.append(f"{rel}:{line}: {value!r}")
    assert not offenders, ("ask models/heads/registry.py (HEADS[kind], a spec's flags and "
                           "names) instead of writing a head kind:\n" + "\n".join(offenders))


def test_every_allowed_literal_is_still_there():
    for rel, value in ALLOWED:
        assert (rel, value) in {(rel, v) for _, v in
                                kind_literals(ast.parse((ROOT / rel).read_text()))}, rel


def test_the_registry_imports_no_torch():
    """Workers and CLIs read kinds without loading torch; head classes load on first use."""
    code = ("import sys\nimport eaglenest.models.heads.registry as r\n"
            "import eaglenest.workers.jobs.options, eaglenest.models.commands\n"
            "assert r.KINDS and 'torch' not in sys.modules, sorted(sys.modules)\n"
            "r.EAGLE.head_class()\nassert 'torch' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_each_spec_builds_saves_and_reloads_its_kind(kind, llama, samples, tmp_path):  # noqa: ANN001
    spec = HEADS[kind]
    config = TrainConfig(head=kind, draft_vocab_size=64)
    head = spec.build(llama, samples, config)
    assert type(head) is spec.head_class()
    assert head_spec(head) is spec and find_head_spec(object()) is None
    assert set(spec.loss_kwargs(config)) <= set(inspect.signature(head.loss).parameters)
    assert hasattr(head, "combine") == spec.uses_aux
    assert hasattr(head, "mask_slots") == spec.parallel
    assert (head.lm_head.out_features < llama.vocab_size) == spec.draft_vocab
    for fmt in spec.formats:
        config_json = build_config(head, fmt, "target", llama.architecture, 3)
        assert spec_of_config(config_json) is spec, fmt
        assert vllm_speculative_method(config_json)["method"] == spec.vllm_method
        assert vllm_speculative_method(config_json).get("parallel_drafting", False) == \
            spec.parallel
        out = save_head(head, tmp_path / fmt, fmt=fmt)
        assert read_head_config(out)[0] == kind
        reloaded = load_head(out, llama.embed_weight(), llama.lm_head_weight())
        assert head_spec(reloaded) is spec
    assert spec.job_format in spec.formats


def test_a_speculators_type_we_do_not_train_is_refused_for_loading_but_served():
    foreign = {"speculators_model_type": "eagle", "architectures": ["EagleSpeculator"]}
    with pytest.raises(ValueError, match="unsupported speculators_model_type 'eagle'"):
        spec_of_config(foreign)
    assert vllm_speculative_method(foreign) == {"method": HEADS["eagle"].vllm_method}
