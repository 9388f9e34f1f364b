# EagleNest API and CPU worker: one image for `eaglenest api`, `migrate` and `worker` on hosts
# without a GPU (the API never trains; it carries torch only so that one image is built
# instead of two). Python packages are the committed lock, requirements/service.txt, exactly:
# installed with --no-deps from docker/wheelhouse/ when it holds wheels (scripts/
# compose_check.sh fills it on the host with `pip download`), else from PyPI plus PyTorch's
# CPU index (torch==2.13.0+cpu is only there), so either way the image gets the CPU torch.
# Needs BuildKit (the default builder since Docker 23; DOCKER_BUILDKIT=1 on Docker 20.10):
# the wheels and the source are bind-mounted into the build, never copied into a layer.
#
# BASE_IMAGE: python:3.11-slim by default; any Debian bookworm root works (CI imports one
# made by debootstrap, as no registry is reachable there): python3.11 then comes from apt.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 LANG=C.UTF-8
RUN set -eu; \
    if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip' 2>/dev/null; then \
      apt-get update -qq; \
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 python3-venv >/dev/null; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), "the lock is for CPython 3.11"'; \
    useradd --create-home --uid 10001 eaglenest; \
    mkdir -p /data && chown eaglenest /data
RUN --mount=type=bind,source=docker/wheelhouse,target=/wheels \
    --mount=type=bind,source=requirements/service.txt,target=/service.txt \
    set -eu; python3 -m venv /opt/eaglenest; \
    if ls /wheels/*.whl >/dev/null 2>&1; then \
      src="--no-index --find-links /wheels"; \
    else \
      src="--only-binary :all: --extra-index-url https://download.pytorch.org/whl/cpu"; \
    fi; \
    /opt/eaglenest/bin/pip install -q --no-deps $src -r /service.txt
# The project itself (its dependencies are all in the lock). .dockerignore trims the context.
RUN --mount=type=bind,target=/src,rw \
    /opt/eaglenest/bin/pip install -q --no-deps --no-index --no-build-isolation /src \
 && /opt/eaglenest/bin/eaglenest --help >/dev/null
ENV PATH=/opt/eaglenest/bin:$PATH EAGLENEST_DATA_DIR=/data HF_HUB_OFFLINE=1
USER eaglenest
WORKDIR /home/eaglenest
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=5 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/ping')"
CMD ["eaglenest", "api", "--host", "0.0.0.0", "--port", "8080"]
