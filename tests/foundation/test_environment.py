"""A caller's environment variables (foundation/environment.py): KNOWN ones reach the
process, DENIED ones are refused naming the variable, any other is IGNORED (accepted,
passed to no process, named in a warning)."""

from __future__ import annotations

import pytest

from eaglenest.foundation import environment
from eaglenest.foundation.environment import (
    EnvironmentRejected,
    Kind,
    check,
    child_environment,
    classify,
    ignored,
    ignored_warning,
    passed,
    rejection,
)

#: what existing SageMaker scripts send (LMI, TGI, the HF DLC, the SageMaker toolkit)
SAGEMAKER_SCRIPT = {"HF_TOKEN": "hf_x", "HF_MODEL_ID": "org/model", "SM_NUM_GPUS": "1",
                    "SAGEMAKER_PROGRAM": "inference.py", "OPTION_ROLLING_BATCH": "vllm",
                    "MAX_INPUT_LENGTH": "1024", "MAX_TOTAL_TOKENS": "2048",
                    "EAGLENEST_MAX_MODEL_LEN": "2048"}


@pytest.mark.parametrize("name", [
    "SM_NUM_GPUS", "OPTION_TENSOR_PARALLEL_DEGREE", "TENSOR_PARALLEL_DEGREE",
    "OPTION_GPU_MEMORY_UTILIZATION", "MAX_INPUT_LENGTH", "MAX_TOTAL_TOKENS",
    "OPTION_MAX_MODEL_LEN", "EAGLENEST_MAX_MODEL_LEN", "EAGLENEST_HEAD", "OMP_NUM_THREADS",
    "EAGLENEST_TORCH_THREADS",
])
def test_known_names(name: str) -> None:
    assert classify(name) is Kind.KNOWN and rejection(name, "1", "Environment") is None


@pytest.mark.parametrize("name", [
    # the security suite's attacks
    "PYTHONWARNINGS", "BROWSER", "LD_PRELOAD", "PYTHONPATH", "HF_HUB_OFFLINE", "VLLM_PLUGINS",
    "OPTION_TRUST_REMOTE_CODE", "EAGLENEST_BROKER_URL",
    # by prefix, suffix or part, in any case
    "LD_AUDIT", "ld_preload", "PYTHONSTARTUP", "VLLM_USE_V1", "http_proxy", "HTTPS_PROXY",
    "no_proxy", "HF_HOME", "HF_ENDPOINT", "HF_MODULES_CACHE", "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE", "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR", "PYTORCH_JIT",
    "TRITON_PTXAS_PATH", "CUDA_VISIBLE_DEVICES", "NCCL_NET_PLUGIN", "GLOO_SOCKET_IFNAME",
    "OMPI_MCA_x", "MALLOC_CONF", "GCONV_PATH", "GLIBC_TUNABLES", "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "AWS_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY",
    "EAGLENEST_COMPUTE_SHARING", "EAGLENEST_INSTANCE_SECRET", "XDG_CACHE_HOME",
    "BASH_FUNC_x%%", "OTEL_EXPORTER_OTLP_ENDPOINT", "TRUST_REMOTE_CODE",
    "HF_MODEL_TRUST_REMOTE_CODE",
    # by name, and the host's and the fixed settings
    "EDITOR", "PAGER", "SHELL", "HOME", "PATH", "path", "TMPDIR", "IFS", "PS4", "BASH_ENV",
    "ENV", "OPTION_ENTRYPOINT", "MASTER_ADDR", "LANG", "TZ", "LOCPATH", "HOSTALIASES",
])
def test_denied_names(name: str) -> None:
    assert classify(name) is Kind.DENIED
    reason = rejection(name, "x", "PrimaryContainer.Environment")
    assert reason is not None and reason.startswith(
        f"Environment variable {name} in PrimaryContainer.Environment is not allowed: ")
    assert reason.endswith("; see docs/security.md.")
    with pytest.raises(EnvironmentRejected, match=f"Environment variable {name} in "):
        check({name: "x"}, "PrimaryContainer.Environment")
    with pytest.raises(EnvironmentRejected):
        child_environment({name: "x"})


def test_the_refusal_names_the_rule() -> None:
    assert "variables named LD_* can change how" in (rejection("LD_AUDIT", "x", "E") or "")
    assert "variables named *_PROXY change what" in (rejection("http_proxy", "x", "E") or "")
    assert "other EAGLENEST_* variables are settings of EagleNest itself" in (
        rejection("EAGLENEST_BROKER_URL", "x", "E") or "")
    assert "never runs a model folder's own code" in (
        rejection("OPTION_TRUST_REMOTE_CODE", "true", "E") or "")


@pytest.mark.parametrize("name", [
    "HF_TOKEN", "HF_MODEL_ID", "HF_MODEL_REVISION", "SAGEMAKER_PROGRAM",
    "SAGEMAKER_SUBMIT_DIRECTORY", "OPTION_ROLLING_BATCH", "SM_MODEL_DIR", "MY_SETTING",
    "omp_num_threads",  # not the KNOWN name (names are case-sensitive)
])
def test_other_names_are_ignored(name: str) -> None:
    assert classify(name) is Kind.IGNORED and rejection(name, "x", "Environment") is None


def test_a_nul_is_refused_whatever_the_kind() -> None:
    for name in ("OMP_NUM_THREADS", "HF_TOKEN"):
        assert rejection(name, "a\x00b", "OptimizationEnvironment") == (
            f"Environment variable {name} in OptimizationEnvironment holds a NUL character.")


def test_known_entries_pass_ignored_ones_are_named() -> None:
    check(SAGEMAKER_SCRIPT, "PrimaryContainer.Environment")  # nothing refused
    assert passed(SAGEMAKER_SCRIPT) == {"SM_NUM_GPUS": "1", "MAX_INPUT_LENGTH": "1024",
                                        "MAX_TOTAL_TOKENS": "2048",
                                        "EAGLENEST_MAX_MODEL_LEN": "2048"}
    assert ignored(SAGEMAKER_SCRIPT) == ["HF_MODEL_ID", "HF_TOKEN", "OPTION_ROLLING_BATCH",
                                         "SAGEMAKER_PROGRAM"]
    assert passed(None) == {} and ignored(None) == []
    assert ignored_warning(SAGEMAKER_SCRIPT, "Environment", "model m") == (
        "ignores Environment variables HF_MODEL_ID, HF_TOKEN, OPTION_ROLLING_BATCH, "
        "SAGEMAKER_PROGRAM of model m: EagleNest does not pass them to the model server or "
        "any process it starts (docs/security.md)")
    assert ignored_warning({"HF_TOKEN": "x"}, "OptimizationEnvironment") == (
        "ignores OptimizationEnvironment variables HF_TOKEN: EagleNest does not pass them to "
        "the model server or any process it starts (docs/security.md)")
    assert ignored_warning({"OMP_NUM_THREADS": "1"}, "Environment") is None


def test_a_child_gets_known_entries_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EAGLENEST_SECRET_ACCESS_KEY", "worker-secret")
    monkeypatch.setenv("HF_TOKEN", "worker-token")
    env = child_environment(SAGEMAKER_SCRIPT, EAGLENEST_INSTANCE_SECRET="s")
    assert env["SM_NUM_GPUS"] == "1" and env["EAGLENEST_MAX_MODEL_LEN"] == "2048"
    assert env["EAGLENEST_INSTANCE_SECRET"] == "s" and env["HF_HUB_OFFLINE"] == "1"
    for name in ("HF_TOKEN", "HF_MODEL_ID", "SAGEMAKER_PROGRAM", "OPTION_ROLLING_BATCH",
                 "EAGLENEST_SECRET_ACCESS_KEY"):
        assert name not in env


def test_no_known_name_matches_a_deny_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """KNOWN is checked first: no name in it (but EagleNest's own options) may be one the
    deny rules would refuse."""
    known = environment.KNOWN
    monkeypatch.setattr(environment, "KNOWN", frozenset())
    assert [n for n in sorted(known)
            if environment.denial(n) and not n.startswith("EAGLENEST_")] == []
