# CI stand-in for MinIO and its `mc` client (neither image can be pulled in CI: no registry):
# moto's S3 server (moto[server], pinned by requirements/lock.txt), a real S3 implementation
# over HTTP - SigV4, multipart uploads, ListObjectsV2 - that boto3 talks to exactly as it
# talks to MinIO. It keeps objects in memory (enough for one CI run). Build context: docker/ci.
# Its wheels are in docker/ci/wheelhouse/: scripts/compose_check.sh downloads them on the host
# with `pip download 'moto[server]' -c requirements/lock.txt`, so they are the locked versions.
# Built with BuildKit (bind mount), as docker/eaglenest.Dockerfile.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-venv >/dev/null \
 && rm -rf /var/lib/apt/lists/* && useradd --create-home --uid 10002 s3
RUN --mount=type=bind,source=wheelhouse,target=/wheels \
    python3 -m venv /opt/moto \
 && /opt/moto/bin/pip install -q --no-index --find-links /wheels 'moto[server]'
ENV PATH=/opt/moto/bin:$PATH
USER s3
CMD ["moto_server", "-H", "127.0.0.1", "-p", "9000"]
