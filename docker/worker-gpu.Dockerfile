# EagleNest worker for NVIDIA GPU hosts: CUDA torch (bf16 training) and vLLM for serving.
# Used by docker/compose.gpu.yml; not built in CI (no GPU, no CUDA base image there).
#
# How CUDA torch and vLLM come in: `pip install vllm==$VLLM_VERSION` from PyPI; vLLM pins
# the CUDA build of torch it was compiled against, so torch is never installed separately
# (the lock's torch==2.13.0+cpu is the CPU build and is left out here). The rest of the
# service lock (requirements/service.txt) is then installed with --no-deps, minus the
# packages vLLM already brought in, so vLLM's pins win where the two differ. The lock is
# resolved for CPython 3.11: the base must provide python3.11 (the default base gets it from
# the deadsnakes PPA; BASE_IMAGE may be any CUDA runtime image with python3.11).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu22.04

FROM ${BASE_IMAGE}
ARG VLLM_VERSION=0.32.0
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 LANG=C.UTF-8
RUN set -eu; \
    if ! command -v python3.11 >/dev/null; then \
      apt-get update -qq; \
      apt-get install -y -qq --no-install-recommends software-properties-common gpg-agent; \
      add-apt-repository -y ppa:deadsnakes/ppa; apt-get update -qq; \
      apt-get install -y -qq --no-install-recommends python3.11 python3.11-venv python3.11-dev; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    useradd --create-home --uid 10001 eaglenest; mkdir -p /data && chown eaglenest /data; \
    python3.11 -m venv /opt/eaglenest
COPY requirements/service.txt /build/service.txt
RUN set -eu; pip=/opt/eaglenest/bin/pip; \
    $pip install -q "vllm==${VLLM_VERSION}"; \
    $pip freeze | sed 's/[=@ ].*//' | tr 'A-Z_' 'a-z-' | sort > /build/have.txt; \
    grep -E '^[A-Za-z]' /build/service.txt | while read -r pin; do \
      name=$(echo "${pin%%==*}" | tr 'A-Z_' 'a-z-'); \
      grep -qx "$name" /build/have.txt || echo "$pin"; \
    done > /build/rest.txt; \
    $pip install -q --no-deps -r /build/rest.txt
COPY . /src
RUN /opt/eaglenest/bin/pip install -q --no-deps --no-build-isolation /src \
 && rm -rf /src /build && /opt/eaglenest/bin/eaglenest --help >/dev/null
ENV PATH=/opt/eaglenest/bin:$PATH EAGLENEST_DATA_DIR=/data HF_HUB_OFFLINE=1
USER eaglenest
WORKDIR /home/eaglenest
HEALTHCHECK --interval=30s --timeout=10s --retries=3 \
  CMD eaglenest status | grep -q "@$(cat /etc/hostname)"
CMD ["eaglenest", "worker", "--queues", "train,serve"]
