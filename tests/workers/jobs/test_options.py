"""OptimizationEnvironment parsing: values become JobOptions; a bad one names the variable
and its constraint (the job then fails with that message as FailureReason)."""

from __future__ import annotations

import pytest

from eaglenest.workers.jobs.options import OptionError, parse_options


def test_train_processes_is_read_and_defaults_to_the_worker_setting() -> None:
    assert parse_options({"EAGLENEST_TRAIN_PROCESSES": "4"}).train_processes == 4
    assert parse_options({}).train_processes is None  # the worker's setting decides


@pytest.mark.parametrize(("raw", "message"), [
    ("0", "EAGLENEST_TRAIN_PROCESSES=0 must be between 1 and 64"),
    ("65", "EAGLENEST_TRAIN_PROCESSES=65 must be between 1 and 64"),
    ("two", "EAGLENEST_TRAIN_PROCESSES='two' is not an integer"),
])
def test_bad_train_processes_names_the_variable(raw: str, message: str) -> None:
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_TRAIN_PROCESSES": raw})
    assert str(exc.value) == message


def test_num_layers_is_read_and_checked_against_the_head() -> None:
    assert parse_options({"EAGLENEST_NUM_LAYERS": "2"}).num_layers == 2
    assert parse_options({}).num_layers == 1
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_NUM_LAYERS": "17"})
    assert str(exc.value) == "EAGLENEST_NUM_LAYERS=17 must be between 1 and 16"
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_NUM_LAYERS": "2", "EAGLENEST_HEAD": "eagle"})
    assert str(exc.value) == ("EAGLENEST_NUM_LAYERS=2 needs an EAGLE-3 or P-EAGLE head; "
                              "EAGLE-2 heads (EAGLENEST_HEAD=eagle) have one layer")


def test_seq_partitions_is_read_and_checked_against_the_head() -> None:
    assert parse_options({"EAGLENEST_SEQ_PARTITIONS": "4",
                          "EAGLENEST_HEAD": "peagle"}).seq_partitions == 4
    assert parse_options({}).seq_partitions == 1
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_SEQ_PARTITIONS": "65"})
    assert str(exc.value) == "EAGLENEST_SEQ_PARTITIONS=65 must be between 1 and 64"
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_SEQ_PARTITIONS": "2", "EAGLENEST_HEAD": "eagle3"})
    assert str(exc.value) == ("EAGLENEST_SEQ_PARTITIONS=2 needs a P-EAGLE head "
                              "(EAGLENEST_HEAD=eagle3)")


def test_bench_ks_default_follows_k_and_is_configurable() -> None:
    assert parse_options({}).measured_ks() == (1, 3, 5)
    assert parse_options({}).concurrency == (1, 2, 4, 8, 16)
    assert parse_options({"EAGLENEST_NUM_SPECULATIVE_TOKENS": "4"}).measured_ks() == (1, 3, 4)
    assert parse_options({"EAGLENEST_BENCH_KS": "5,1,5"}).measured_ks() == (1, 5)
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_BENCH_KS": "0,3"})
    assert str(exc.value) == "EAGLENEST_BENCH_KS=0 must be between 1 and 64"
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_BENCH_KS": ","})
    assert str(exc.value) == "EAGLENEST_BENCH_KS must list K values, e.g. 1,3,5"


def test_bench_rounds_defaults_to_two_and_names_the_variable() -> None:
    assert parse_options({}).bench_rounds == 2
    assert parse_options({"EAGLENEST_BENCH_ROUNDS": "1"}).bench_rounds == 1
    for raw, message in (("0", "EAGLENEST_BENCH_ROUNDS=0 must be between 1 and 10"),
                         ("11", "EAGLENEST_BENCH_ROUNDS=11 must be between 1 and 10"),
                         ("x", "EAGLENEST_BENCH_ROUNDS='x' is not an integer")):
        with pytest.raises(OptionError) as exc:
            parse_options({"EAGLENEST_BENCH_ROUNDS": raw})
        assert str(exc.value) == message


def test_training_stop_options_default_and_name_the_variable() -> None:
    opts = parse_options({})
    assert (opts.eval_every, opts.max_train_minutes, opts.plateau_evals) == (50, 30.0, 4)
    assert (opts.max_steps, opts.regenerate) == (100_000, True)
    opts = parse_options({"EAGLENEST_EVAL_EVERY": "10", "EAGLENEST_MAX_TRAIN_MINUTES": "1.5",
                          "EAGLENEST_PLATEAU_EVALS": "3"})
    assert (opts.eval_every, opts.max_train_minutes, opts.plateau_evals) == (10, 1.5, 3)
    for name, raw in [("EAGLENEST_MAX_TRAIN_MINUTES", "-1"), ("EAGLENEST_MAX_TRAIN_MINUTES", "soon"),
                      ("EAGLENEST_PLATEAU_EVALS", "-2"), ("EAGLENEST_EVAL_EVERY", "x")]:
        with pytest.raises(OptionError) as exc:
            parse_options({name: raw})
        assert name in str(exc.value)


def test_regenerate_cache_is_a_flag_defaulting_to_on() -> None:
    assert parse_options({}).regenerate_cache is True
    assert parse_options({"EAGLENEST_REGENERATE_CACHE": "0"}).regenerate_cache is False
    assert parse_options({"EAGLENEST_REGENERATE_CACHE": "true"}).regenerate_cache is True
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_REGENERATE_CACHE": "yes"})
    assert str(exc.value) == "EAGLENEST_REGENERATE_CACHE='yes' must be 0 or 1"


def test_ttt_steps_maps_onto_each_kinds_steps_setting() -> None:
    """EAGLENEST_TTT_STEPS: EAGLE-3's ttt_steps, P-EAGLE's parallel_depth; refused for the
    kinds without draft steps trained on their own outputs."""
    from eaglenest.workers.jobs.options import train_settings

    assert parse_options({}).ttt_steps is None
    assert train_settings(parse_options({}), "eagle3") == {}
    opts = parse_options({"EAGLENEST_TTT_STEPS": "5"})
    assert train_settings(opts, "eagle3") == {"ttt_steps": 5}
    assert train_settings(parse_options({"EAGLENEST_TTT_STEPS": "2", "EAGLENEST_HEAD":
                                         "peagle"}), "peagle") == {"parallel_depth": 2}
    for kind in ("eagle", "dflash"):
        with pytest.raises(OptionError) as exc:
            parse_options({"EAGLENEST_TTT_STEPS": "5", "EAGLENEST_HEAD": kind})
        assert str(exc.value) == ("EAGLENEST_TTT_STEPS=5 needs a head trained steps deep "
                                  f"(EAGLENEST_HEAD=eagle3, peagle), not {kind}")
    for raw, message in (("0", "EAGLENEST_TTT_STEPS=0 must be between 1 and 8"),
                         ("9", "EAGLENEST_TTT_STEPS=9 must be between 1 and 8")):
        with pytest.raises(OptionError) as exc:
            parse_options({"EAGLENEST_TTT_STEPS": raw})
        assert str(exc.value) == message


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("EAGLENEST_REGENERATE_SAMPLES", "5", "EAGLENEST_REGENERATE_SAMPLES=5 must be between 0 "
     "and 4"),
    ("EAGLENEST_REGENERATE_TEMPERATURE", "0", "EAGLENEST_REGENERATE_TEMPERATURE='0' must be a "
     "number above 0 and at most 2"),
    ("EAGLENEST_REGENERATE_TEMPERATURE", "nan", "EAGLENEST_REGENERATE_TEMPERATURE='nan' is not "
     "a finite number"),
])
def test_bad_regeneration_sampling_names_the_variable(name: str, raw: str, message: str) -> None:
    with pytest.raises(OptionError) as exc:
        parse_options({name: raw})
    assert str(exc.value) == message


def test_regeneration_samples_default_to_none() -> None:
    opts = parse_options({})
    assert (opts.regenerate_samples, opts.regenerate_temperature) == (0, 0.8)
    opts = parse_options({"EAGLENEST_REGENERATE_SAMPLES": "1",
                          "EAGLENEST_REGENERATE_TEMPERATURE": "1"})
    assert (opts.regenerate_samples, opts.regenerate_temperature) == (1, 1.0)
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_REGENERATE_SAMPLES": "1", "EAGLENEST_REGENERATE": "0"})
    assert str(exc.value) == ("EAGLENEST_REGENERATE_SAMPLES=1 needs EAGLENEST_REGENERATE=1 "
                              "(the target answers the examples)")


def test_every_job_option_is_allowed_in_optimization_environment() -> None:
    """CreateOptimizationJob denies EAGLENEST_* names outside JOB_OPTIONS: every option the
    job parses must be listed there, or it could never be set."""
    from eaglenest.foundation.environment import JOB_OPTIONS
    from eaglenest.workers.jobs.options import JobOptions

    aliases = {f.alias for f in JobOptions.model_fields.values() if f.alias}
    assert aliases, "JobOptions has no aliased options"
    assert aliases - JOB_OPTIONS == set()


#: the block head kind (models/heads/registry.py: its default mode drafts a block)
BLOCK = "dflash"


def test_block_head_options_are_read_and_mapped_onto_training() -> None:
    from eaglenest.models.training.config import TrainConfig
    from eaglenest.workers.jobs.options import for_kind, train_settings

    opts = parse_options({"EAGLENEST_HEAD": BLOCK, "EAGLENEST_DFLASH_BLOCK_SIZE": "4",
                          "EAGLENEST_DFLASH_LAYERS": "2", "EAGLENEST_DFLASH_GAMMA": "3.5"})
    assert (opts.dflash_block_size, opts.dflash_layers, opts.dflash_gamma) == (4, 2, 3.5)
    job = for_kind(opts, BLOCK)
    assert job.num_speculative_tokens == 3  # K = block_size - 1
    settings = train_settings(job, BLOCK)
    assert settings == {"dflash_block_size": 4, "dflash_layers": 2, "dflash_gamma": 3.5}
    config = TrainConfig(head=BLOCK, **settings)
    assert (config.dflash_block_size, config.dflash_layers, config.dflash_gamma) == (4, 2, 3.5)
    # unset: TrainConfig's defaults; EAGLENEST_NUM_LAYERS, when set, is the layer count
    opts = parse_options({"EAGLENEST_HEAD": BLOCK})
    assert train_settings(opts, BLOCK) == {"dflash_block_size": TrainConfig.dflash_block_size}
    opts = parse_options({"EAGLENEST_HEAD": BLOCK, "EAGLENEST_NUM_LAYERS": "5"})
    assert train_settings(opts, BLOCK)["dflash_layers"] == 5
    # other kinds take none of them and keep their K
    assert train_settings(parse_options({}), "eagle3") == {}
    assert for_kind(parse_options({}), "eagle3") == parse_options({})


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("EAGLENEST_DFLASH_BLOCK_SIZE", "1", "EAGLENEST_DFLASH_BLOCK_SIZE=1 must be between 2 and 16"),
    ("EAGLENEST_DFLASH_BLOCK_SIZE", "17",
     "EAGLENEST_DFLASH_BLOCK_SIZE=17 must be between 2 and 16"),
    ("EAGLENEST_DFLASH_BLOCK_SIZE", "8.5", "EAGLENEST_DFLASH_BLOCK_SIZE='8.5' is not an integer"),
    ("EAGLENEST_DFLASH_LAYERS", "0", "EAGLENEST_DFLASH_LAYERS=0 must be between 1 and 8"),
    ("EAGLENEST_DFLASH_LAYERS", "9", "EAGLENEST_DFLASH_LAYERS=9 must be between 1 and 8"),
    ("EAGLENEST_DFLASH_GAMMA", "0", "EAGLENEST_DFLASH_GAMMA='0' must be a number above 0 and at "
                                    "most 64"),
    ("EAGLENEST_DFLASH_GAMMA", "64.5", "EAGLENEST_DFLASH_GAMMA='64.5' must be a number above 0 "
                                       "and at most 64"),
    ("EAGLENEST_DFLASH_GAMMA", "nan", "EAGLENEST_DFLASH_GAMMA='nan' is not a finite number"),
    ("EAGLENEST_DFLASH_GAMMA", "inf", "EAGLENEST_DFLASH_GAMMA='inf' is not a finite number"),
    ("EAGLENEST_DFLASH_GAMMA", "seven", "EAGLENEST_DFLASH_GAMMA='seven' is not a number"),
])
def test_bad_block_head_options_name_the_variable(name: str, raw: str, message: str) -> None:
    with pytest.raises(OptionError) as exc:
        parse_options({"EAGLENEST_HEAD": BLOCK, name: raw})
    assert str(exc.value) == message


@pytest.mark.parametrize(("env", "message"), [
    ({"EAGLENEST_HEAD": "eagle3", "EAGLENEST_DFLASH_BLOCK_SIZE": "4"},
     f"EAGLENEST_DFLASH_BLOCK_SIZE=4 needs a block head (EAGLENEST_HEAD={BLOCK}), not eagle3"),
    ({"EAGLENEST_HEAD": "peagle", "EAGLENEST_DFLASH_GAMMA": "2"},
     f"EAGLENEST_DFLASH_GAMMA=2.0 needs a block head (EAGLENEST_HEAD={BLOCK}), not peagle"),
    ({"EAGLENEST_HEAD": BLOCK, "EAGLENEST_DFLASH_BLOCK_SIZE": "4",
      "EAGLENEST_NUM_SPECULATIVE_TOKENS": "5"},
     "EAGLENEST_NUM_SPECULATIVE_TOKENS=5: a block of 4 slots drafts at most 3 "
     "(EAGLENEST_DFLASH_BLOCK_SIZE)"),
    ({"EAGLENEST_HEAD": BLOCK, "EAGLENEST_DFLASH_BLOCK_SIZE": "4", "EAGLENEST_BENCH_KS": "1,5"},
     "EAGLENEST_BENCH_KS=5: a block of 4 slots drafts at most 3 (EAGLENEST_DFLASH_BLOCK_SIZE)"),
    ({"EAGLENEST_HEAD": BLOCK, "EAGLENEST_NUM_LAYERS": "12"},
     "EAGLENEST_NUM_LAYERS=12: DFlash heads have 1 to 8 layers"),
    ({"EAGLENEST_HEAD": BLOCK, "EAGLENEST_NUM_LAYERS": "2", "EAGLENEST_DFLASH_LAYERS": "3"},
     "EAGLENEST_DFLASH_LAYERS=3 and EAGLENEST_NUM_LAYERS=2 disagree; set one"),
])
def test_block_options_are_checked_against_the_head(env: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError) as exc:
        parse_options(env)
    assert str(exc.value) == message


def test_block_options_without_a_head_are_checked_against_the_architectures_default() -> None:
    """EAGLENEST_HEAD unset: the target's default kind (an EAGLE-3 head for Llama) decides,
    when the job has read the model's architecture (workers/jobs/job_target.py)."""
    from eaglenest.models.target import SUPPORTED_ARCHITECTURES
    from eaglenest.workers.jobs.job_target import check_head

    opts = parse_options({"EAGLENEST_DFLASH_BLOCK_SIZE": "4"})  # no kind yet: accepted
    with pytest.raises(OptionError) as exc:
        check_head(opts, SUPPORTED_ARCHITECTURES["LlamaForCausalLM"])
    assert str(exc.value) == ("EAGLENEST_DFLASH_BLOCK_SIZE=4 needs a block head "
                              f"(EAGLENEST_HEAD={BLOCK}), not eagle3")
    opts = parse_options({"EAGLENEST_HEAD": BLOCK, "EAGLENEST_DFLASH_BLOCK_SIZE": "4"})
    assert check_head(opts, SUPPORTED_ARCHITECTURES["LlamaForCausalLM"]) == BLOCK


@pytest.mark.parametrize(("env", "k", "ks"), [
    ({"EAGLENEST_DFLASH_BLOCK_SIZE": "16"}, 7, (1, 3, 5, 7)),
    ({"EAGLENEST_DFLASH_BLOCK_SIZE": "8"}, 7, (1, 3, 5, 7)),
    ({"EAGLENEST_DFLASH_BLOCK_SIZE": "5"}, 4, (1, 3, 4)),
    ({"EAGLENEST_DFLASH_BLOCK_SIZE": "2"}, 1, (1,)),
    ({"EAGLENEST_DFLASH_BLOCK_SIZE": "16", "EAGLENEST_NUM_SPECULATIVE_TOKENS": "3"}, 3, (1, 3)),
    ({"EAGLENEST_DFLASH_BLOCK_SIZE": "16", "EAGLENEST_BENCH_KS": "15,2"}, 7, (2, 15)),
])
def test_a_block_heads_k_and_benchmark_rows_follow_its_block_size(
        env: dict[str, str], k: int, ks: tuple[int, ...]) -> None:
    """K = drafts per round = block length - 1: the rows K = 1, 3, 5, 7 capped there."""
    from eaglenest.workers.jobs.options import for_kind

    job = for_kind(parse_options({"EAGLENEST_HEAD": BLOCK, **env}), BLOCK)
    assert (job.num_speculative_tokens, job.measured_ks()) == (k, ks)


def test_a_block_head_trained_further_keeps_its_block_unless_told() -> None:
    from eaglenest.workers.jobs.job_target import StartHead, inherit
    from eaglenest.workers.jobs.options import for_kind

    start = StartHead(BLOCK, [1, 4], 16)
    opts = inherit(parse_options({"EAGLENEST_HEAD": BLOCK}), start)
    assert opts.dflash_block_size == 16 and for_kind(opts, BLOCK).measured_ks() == (1, 3, 5, 7)
    told = {"EAGLENEST_HEAD": BLOCK, "EAGLENEST_DFLASH_BLOCK_SIZE": "4"}
    assert inherit(parse_options(told), start).dflash_block_size == 4
    # another kind asked (the job then fails naming the channel's kind), or no head: unchanged
    assert inherit(parse_options({"EAGLENEST_HEAD": "eagle3"}), start).dflash_block_size is None
    assert inherit(parse_options({}), start) == parse_options({})
    assert inherit(parse_options({"EAGLENEST_HEAD": BLOCK}), None).dflash_block_size is None
