# EagleNest API (control plane + sagemaker-runtime). No torch: the API never trains.
FROM python:3.11-slim AS base
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
RUN pip install .
USER eaglenest
ENV EAGLENEST_DATA_DIR=/data
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=5 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/ping')"
CMD ["eaglenest", "api", "--host", "0.0.0.0", "--port", "8080"]
