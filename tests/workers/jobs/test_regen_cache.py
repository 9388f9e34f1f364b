"""The regeneration cache (workers/jobs/regen_cache.py) in the optimization pipeline: jobs
run in this process on the tiny target with a real local store (no stack), the benchmark off,
8 new tokens per regenerated turn (job_data.REGEN_PARAMS, patched here: the key includes
it). A second job on the same target, data, seed and split takes the first's regenerated
examples from `<S3OutputLocation>/.eaglenest-cache/regenerate/<key>.jsonl` without
generating, and trains on the same examples; any changed input misses; a bad file is
ignored with a warning and replaced; EAGLENEST_REGENERATE_CACHE=0 neither reads nor writes;
a failing store costs the cache, not the job."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from eaglenest.foundation.environment import Kind, classify
from eaglenest.foundation.shapes import rebuild
from eaglenest.foundation.shapes.optimization_jobs import CreateOptimizationJobRequest
from eaglenest.foundation.store.storage import LocalStore, S3Uri, parse_uri
from eaglenest.models.data import Chat, Completion
from eaglenest.models.data import regenerate as regenerate_module
from eaglenest.workers.jobs import job_data, regen_cache
from eaglenest.workers.jobs import pipeline as pipeline_module
from eaglenest.workers.jobs.inputs import JobSources
from eaglenest.workers.jobs.options import parse_options
from eaglenest.workers.jobs.pipeline import Pipeline
from tests.support.jobs import job

ENV = {"EAGLENEST_MAX_STEPS": "1", "EAGLENEST_MAX_LENGTH": "128", "EAGLENEST_HOLDOUT": "1",
       "EAGLENEST_BENCHMARK": "0", "EAGLENEST_CHECKPOINT_EVERY": "0", "EAGLENEST_DEVICE": "cpu",
       "EAGLENEST_EVAL_EVERY": "0", "EAGLENEST_PLATEAU_EVALS": "0",
       "EAGLENEST_MAX_TRAIN_MINUTES": "0"}  # EAGLENEST_REGENERATE(_CACHE): the defaults, 1
LOCATION = "s3://output/jobs/"
CACHE = "s3://output/jobs/.eaglenest-cache/regenerate/"
DATA = [
    {"messages": [{"role": "user", "content": "Chen collected 24 pencils in April and half "
                   "as many in May. How many altogether?"},
                  {"role": "assistant", "content": "24 + 12 = 36 pencils.\n#### 36"}]},
    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "What is 2 + 3?"},
                  {"role": "assistant", "content": "5"},
                  {"role": "user", "content": "And 5 + 7?"},
                  {"role": "assistant", "content": "12"}]},
    {"prompt": "def add(a, b):\n", "completion": "    return a + b\n"},
    {"messages": [{"role": "user", "content": "Sort the list 3, 1, 2."},
                  {"role": "assistant", "content": "1, 2, 3"}]},
]
TURNS = 5  # assistant turns (a completion counts one)


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


class Control:
    """JobControl's surface for the pipeline: the progress records, no stop."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def check(self) -> None:
        pass

    def report(self, progress: dict[str, Any]) -> None:
        self.records.append(progress)

    def should_stop(self) -> bool:
        return False


@dataclass
class Run:
    """What one job did: the pipeline's generate calls, the examples it trained on and held
    out (after regeneration), its stages, log records and provenance."""

    name: str
    generations: int = 0
    train: list[Any] = field(default_factory=list)
    holdout: list[Any] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    logs: list[logging.LogRecord] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)

    def messages(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in self.logs if r.levelno == level]

    @property
    def regeneration(self) -> Any:
        """provenance.json's record of the regeneration (None: EAGLENEST_REGENERATE=0)."""
        return self.provenance["train"]["regeneration"]


class _Records(logging.Handler):
    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record)


def _spy(mp: pytest.MonkeyPatch, run: Run) -> None:
    """Count regenerate() calls (the target's generation) and keep the examples the pipeline
    encodes for training and passes as held-out."""
    real_regenerate = regenerate_module.regenerate
    real_encode, real_heldout = pipeline_module.encode_examples, job_data.heldout_samples

    def regenerate(*args: Any, **kwargs: Any) -> Any:
        run.generations += 1
        return real_regenerate(*args, **kwargs)

    def encode(examples: list[Any], *args: Any) -> Any:
        run.train = list(examples)
        return real_encode(examples, *args)

    def heldout(target: Any, holdout: list[Any], *args: Any) -> Any:
        run.holdout = list(holdout)
        return real_heldout(target, holdout, *args)

    mp.setattr(regenerate_module, "regenerate", regenerate)
    mp.setattr(pipeline_module, "encode_examples", encode)
    mp.setattr(job_data, "heldout_samples", heldout)


def run_job(store: Any, work: Path, name: str, location: str = LOCATION,
            model: str = "s3://models/tiny/", data: str = "s3://data/chats/",
            **env: str) -> Run:
    """One optimization job, to its end, with `env` over ENV."""
    variables = {**ENV, **env}
    args = job(model, **variables)
    args["OptimizationEnvironment"] = variables
    args["OutputConfig"] = {"S3OutputLocation": location}
    spec = rebuild(CreateOptimizationJobRequest, {"OptimizationJobName": name, **args})
    run, control = Run(name), Control()
    logger, handler = logging.getLogger("eaglenest.optimize"), _Records(run.logs)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with pytest.MonkeyPatch.context() as mp:
            _spy(mp, run)
            Pipeline(name, spec, parse_options(variables), JobSources(model, None, data,
                     "S3Prefix"), store, work / name, control).run()  # type: ignore[arg-type]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    run.stages = [r["stage"] for r in control.records if "stage" in r]
    prov = parse_uri(f"{location.rstrip('/')}/{name}/provenance.json")
    run.provenance = json.loads(store.get_bytes(prov))
    return run


def _cache_files(store: LocalStore, location: str = LOCATION) -> dict[str, bytes]:
    prefix = parse_uri(location.rstrip("/") + "/" + regen_cache.PREFIX)
    return {k: store.get_bytes(S3Uri(prefix.bucket, k)) for k in store.list_keys(prefix)}


def _changed_model(src: Path, dest: Path) -> Path:
    """`src` with one weight nudged (everything else byte for byte)."""
    shutil.copytree(src, dest)
    weights = load_file(src / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-3
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


@pytest.fixture(scope="module")
def short_turns() -> Iterator[None]:
    """8 new tokens per regenerated turn: seconds, not minutes, on the tiny target."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(job_data.REGEN_PARAMS, "max_new_tokens", 8)
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> LocalStore:
    s = LocalStore(tmp_path_factory.mktemp("s3"))
    changed = _changed_model(tiny_llama_dir, tmp_path_factory.mktemp("changed") / "llama")
    for folder, uri in ((tiny_llama_dir, "s3://models/tiny/"),
                        (changed, "s3://models/tiny-changed/")):
        for f in folder.iterdir():
            s.put_file(parse_uri(uri + f.name), f)
    s.put_bytes(parse_uri("s3://data/chats/train.jsonl"), _jsonl(DATA))
    other = [{"messages": [{"role": "user", "content": "Chen collected 25 pencils."},
                           *DATA[0]["messages"][1:]]}, *DATA[1:]]
    s.put_bytes(parse_uri("s3://data/other/train.jsonl"), _jsonl(other))
    return s


@pytest.fixture(scope="module")
def first(store: LocalStore, short_turns: None,
          tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The first job: it regenerates, and writes the cache."""
    return run_job(store, tmp_path_factory.mktemp("work"), "regen-first")


def test_the_first_job_regenerates_and_writes_the_cache(store, first):
    assert first.generations == 1
    record = first.regeneration
    key = record["key"]
    assert len(key) == 64 and int(key, 16) >= 0
    assert record == {"from_cache": False, "key": key, "uri": f"{CACHE}{key}.jsonl",
                      "turns": TURNS}
    assert f"job regen-first: wrote the regenerated answers to the cache {CACHE}{key}.jsonl" \
        in " ".join(first.messages())
    assert "regenerate assistant turns with the target" in first.stages
    # the file: data only, the header and then the examples the job trained on and held out
    files = _cache_files(store)
    assert list(files) == [f"jobs/.eaglenest-cache/regenerate/{key}.jsonl"]
    lines = [json.loads(x) for x in files[next(iter(files))].decode().splitlines()]
    assert lines[0] == {"format": regen_cache.FORMAT, "key": key, "train": 3, "holdout": 1,
                        "turns": TURNS, "job": "regen-first"}
    train, holdout = regen_cache.parse(files[next(iter(files))], key)
    assert (train, holdout) == (first.train, first.holdout)
    assert [type(e) for e in train] == [Chat, Chat, Completion]
    # regenerated: the prompts as written, the answers the target's
    assert train[1].messages[:2] == DATA[1]["messages"][:2]
    assert train[1].messages[2]["content"] != "5" and train[2].completion != DATA[2]["completion"]
    assert train[2].prompt == DATA[2]["prompt"]


def test_a_second_job_on_the_same_inputs_reuses_the_answers(store, first, tmp_path):
    before = _cache_files(store)
    second = run_job(store, tmp_path, "regen-second")
    assert second.generations == 0  # the target generated nothing
    key = first.regeneration["key"]
    stage = f"regenerated answers from the cache {CACHE}{key}.jsonl ({TURNS} turns)"
    assert f"job regen-second: {stage}" in second.messages()
    assert stage in second.stages
    assert "regenerate assistant turns with the target" not in second.stages
    assert (second.train, second.holdout) == (first.train, first.holdout)
    assert second.regeneration == {**first.regeneration, "from_cache": True}
    assert _cache_files(store) == before  # read, not rewritten
    losses = [json.loads(store.get_bytes(parse_uri(f"{LOCATION}{r.name}/training_log.jsonl"))
                         .decode().splitlines()[0])["loss"] for r in (first, second)]
    assert losses[0] == losses[1]  # the same examples, the same seed: the same first step


@pytest.mark.parametrize(("change", "overrides"), [
    ("seed", {"env": {"EAGLENEST_SEED": "1"}}),
    ("holdout split", {"env": {"EAGLENEST_HOLDOUT": "2"}}),
    ("data", {"data": "s3://data/other/"}),
    ("model file", {"model": "s3://models/tiny-changed/"}),
])
def test_a_changed_input_misses(store, first, tmp_path, change, overrides):
    before = _cache_files(store)
    name = "regen-" + change.replace(" ", "-")
    kwargs = {k: v for k, v in overrides.items() if k != "env"}
    run = run_job(store, tmp_path, name, **kwargs, **overrides.get("env", {}))
    assert run.generations == 1, change
    record = run.regeneration
    assert record["from_cache"] is False and record["key"] != first.regeneration["key"]
    assert not any("from the cache" in m for m in run.messages())
    after = _cache_files(store)
    new = f"jobs/.eaglenest-cache/regenerate/{record['key']}.jsonl"
    assert set(after) == set(before) | {new}  # its own file beside the others
    assert {k: after[k] for k in before} == before
    assert regen_cache.parse(after[new], record["key"]) == (run.train, run.holdout)


def test_changed_regeneration_parameters_miss(store, first, tmp_path, monkeypatch):
    monkeypatch.setitem(job_data.REGEN_PARAMS, "max_new_tokens", 6)
    run = run_job(store, tmp_path, "regen-params")
    assert run.generations == 1
    assert run.regeneration["key"] != first.regeneration["key"]


def test_sampled_answers_are_training_examples_of_their_own_each_pass_cached(
        store, first, tmp_path):
    """EAGLENEST_REGENERATE_SAMPLES=1: the greedy answers come from the first job's cache,
    the sampled pass is the one generation, at its temperature and seed, written to a file
    of its own that a second such job reuses; the held-out examples stay greedy."""
    sampled = {"EAGLENEST_REGENERATE_SAMPLES": "1", "EAGLENEST_REGENERATE_TEMPERATURE": "1.5"}
    run = run_job(store, tmp_path / "a", "regen-sampled", **sampled)
    assert run.generations == 1  # the sampled pass only
    record = run.regeneration
    (pass1,) = record.pop("samples")
    assert record == {**first.regeneration, "from_cache": True}
    key = pass1["key"]
    assert key not in (None, first.regeneration["key"])
    assert pass1 == {"from_cache": False, "key": key, "uri": f"{CACHE}{key}.jsonl",
                     "turns": 4, "examples": 3}  # the training examples' turns only
    assert "regenerate sampled answers 1/1 (temperature 1.5) with the target" in run.stages
    greedy, more = run.train[:3], run.train[3:]
    assert greedy == first.train and run.holdout == first.holdout
    # the same prompts, the target's other (sampled) answers
    assert [e.prompt if isinstance(e, Completion) else e.messages[0] for e in more] == [
        e.prompt if isinstance(e, Completion) else e.messages[0] for e in greedy]
    assert more != greedy
    cached, held = regen_cache.parse(_cache_files(store)[
        f"jobs/.eaglenest-cache/regenerate/{key}.jsonl"], key)
    assert (cached, held) == (more, [])
    again = run_job(store, tmp_path / "b", "regen-sampled-again", **sampled)
    assert again.generations == 0 and again.train == run.train
    assert again.regeneration["samples"] == [{**pass1, "from_cache": True}]
    # another temperature is another pass: it misses
    other = run_job(store, tmp_path / "c", "regen-sampled-other",
                    EAGLENEST_REGENERATE_SAMPLES="1", EAGLENEST_REGENERATE_TEMPERATURE="0.5")
    assert other.generations == 1 and other.regeneration["samples"][0]["key"] != key


def test_sample_passes_seed_each_pass_apart() -> None:
    options = parse_options({"EAGLENEST_REGENERATE_SAMPLES": "2", "EAGLENEST_SEED": "7"})
    passes = job_data.sample_passes(options)
    assert [(what, seed) for what, seed, _ in passes] == [
        ("sampled answers 1/2 (temperature 0.8)", 7 + job_data.SAMPLE_SEED_STRIDE),
        ("sampled answers 2/2 (temperature 0.8)", 7 + 2 * job_data.SAMPLE_SEED_STRIDE)]
    assert all(p == {**job_data.REGEN_PARAMS, "temperature": 0.8} for _, _, p in passes)
    assert job_data.sample_passes(parse_options({})) == []


def _wrong_key(good: bytes, key: str) -> bytes:
    lines = good.splitlines(keepends=True)
    return lines[0].replace(key.encode(), b"0" * 64) + b"".join(lines[1:])


@pytest.mark.parametrize(("bad", "reason"), [
    (lambda good, key: b"\x00not json{", "not JSON Lines"),
    (lambda good, key: good[: len(good) // 2], "not JSON Lines"),
    (lambda good, key: b"".join(good.splitlines(keepends=True)[:-1]),
     "the header counts 3 + 1 examples, the file holds 3"),
    (_wrong_key, "its header names another key (0000000000000000...)"),
    (lambda good, key: good.replace(b'"role":"user"', b'"role":["user"]', 1),
     "not a chat or completion example"),
    (lambda good, key: good.replace(b'"format":1', b'"format":999', 1),
     "no header of format 1"),
])
def test_a_bad_cache_file_is_ignored_with_a_warning_and_replaced(store, first, tmp_path, bad,
                                                                 reason):
    key = first.regeneration["key"]
    good = _cache_files(store)[f"jobs/.eaglenest-cache/regenerate/{key}.jsonl"]
    location = "s3://output/bad/"
    uri = f"{location}{regen_cache.PREFIX}{key}.jsonl"
    store.put_bytes(parse_uri(uri), bad(good, key))
    run = run_job(store, tmp_path, "regen-bad", location=location)
    warnings = run.messages(logging.WARNING)
    assert len(warnings) == 1 and warnings[0].startswith(
        f"job regen-bad: ignoring the regeneration cache {uri}: {reason}"), warnings
    assert run.generations == 1  # regenerated, and the job went on
    assert (run.train, run.holdout) == (first.train, first.holdout)
    replaced = store.get_bytes(parse_uri(uri))
    assert regen_cache.parse(replaced, key) == (first.train, first.holdout)
    assert run.regeneration == {"from_cache": False, "key": key, "uri": uri, "turns": TURNS}


def test_cache_off_neither_reads_nor_writes(store, first, tmp_path):
    before = _cache_files(store)
    assert before  # the first job's file is there to be read
    run = run_job(store, tmp_path, "regen-off", EAGLENEST_REGENERATE_CACHE="0")
    assert run.generations == 1
    assert run.regeneration == {"from_cache": False, "key": None, "uri": None, "turns": TURNS}
    assert not any("cache" in s for s in run.stages)
    assert not any("cache" in m for m in run.messages())
    assert _cache_files(store) == before
    assert (run.train, run.holdout) == (first.train, first.holdout)  # the same answers
    assert classify("EAGLENEST_REGENERATE_CACHE") is Kind.KNOWN  # Create passes it on


def test_regenerate_off_leaves_the_cache_alone(store, first, tmp_path):
    run = run_job(store, tmp_path, "regen-none", EAGLENEST_REGENERATE="0")
    assert run.generations == 0 and run.regeneration is None
    assert not any("cache" in s for s in run.stages)


class FailingPuts(LocalStore):
    """A store whose puts under the cache prefix fail (an outage, a denied write)."""

    def put_bytes(self, uri: S3Uri, data: bytes) -> None:
        if regen_cache.PREFIX in uri.key:
            raise ConnectionError("the store is unreachable")
        super().put_bytes(uri, data)


def test_a_failed_write_costs_the_cache_not_the_job(store, first, tmp_path):
    failing = FailingPuts(store.root)
    run = run_job(failing, tmp_path, "regen-nowrite", location="s3://output/nowrite/")
    assert run.generations == 1
    assert run.regeneration["uri"] is None and run.regeneration["key"]
    uri = f"s3://output/nowrite/{regen_cache.PREFIX}{run.regeneration['key']}.jsonl"
    assert run.messages(logging.WARNING) == [
        f"job regen-nowrite: could not write the regeneration cache {uri} "
        "(ConnectionError: the store is unreachable)"]
    assert _cache_files(store, "s3://output/nowrite/") == {}


def test_the_key_follows_every_file_of_the_target(tmp_path, tiny_llama_dir):
    """folder_digest: the same content anywhere, the same digest; a byte changed in any file
    (weights, tokenizer, generation config), another."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(tiny_llama_dir, a)
    shutil.copytree(tiny_llama_dir, b)
    digest = regen_cache.folder_digest(a)
    assert regen_cache.folder_digest(b) == digest
    for f in sorted(p for p in b.iterdir() if p.is_file()):
        saved = f.read_bytes()
        f.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))
        assert regen_cache.folder_digest(b) != digest, f.name
        f.write_bytes(saved)
    (b / "extra.json").write_text("{}")
    assert regen_cache.folder_digest(b) != digest


def test_a_folder_is_hashed_once_while_unchanged(tmp_path, tiny_llama_dir):
    """The regeneration and shard caches of one job hash one target: the second time is
    free while no file's size or modification time changed; a touched file is read again."""
    a = tmp_path / "a"
    shutil.copytree(tiny_llama_dir, a)
    before = regen_cache._digest.cache_info()
    digest = regen_cache.folder_digest(a)
    assert regen_cache.folder_digest(a) == digest
    after = regen_cache._digest.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    config = a / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert regen_cache.folder_digest(a) == digest  # the same bytes, hashed again
    assert regen_cache._digest.cache_info().misses - before.misses == 2


def test_examples_round_trip_as_data():
    examples = [Chat([{"role": "system", "content": "s\u2028\x85"},
                      {"role": "assistant", "content": ""}]), Completion("p", "")]
    key = "k" * 64
    data = regen_cache.dump(key, examples[:1], examples[1:], "job", 2)
    assert regen_cache.parse(data, key) == ([examples[0]], [examples[1]])
    assert data.isascii() and data.count(b"\n") == 3
    for record in ({"messages": "x"}, {"prompt": "p"}, {"prompt": 1, "completion": "c"},
                   {"messages": [{"role": "wizard", "content": "x"}]}, ["messages"],
                   {"messages": [], "extra": 1}, {"__class__": "Chat"}):
        with pytest.raises(regen_cache.CacheError):
            regen_cache.decode(record)
