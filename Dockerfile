# syntax=docker/dockerfile:1
#
# The compaction-worker image: the package without its `embedded` and `dev` extras, so it
# always talks to a real Kafka and Redis. Configure it with COMPACTION_* environment
# variables (at least COMPACTION_KAFKA__BOOTSTRAP_SERVERS and COMPACTION_REDIS__URL).
#
#   docker build -t compaction-worker .
#   docker run --rm --stop-timeout 30 -e COMPACTION_KAFKA__BOOTSTRAP_SERVERS=... \
#       -e COMPACTION_REDIS__URL=... compaction-worker
#
# The health port is on (COMPACTION_HEALTH__*: /livez, /readyz, /metrics on 8080, all
# interfaces); the Kubernetes probes (deploy/kubernetes/deployment.yaml) call it, and so
# does the HEALTHCHECK below (with the image's own Python, for `docker run` and compose).
#
# Installs exactly what CI tested: uv.lock, hash-checked, by the uv release the README names.

FROM python:3.11-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_PROJECT_ENVIRONMENT=/opt/venv \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_NO_CACHE=1

RUN pip install uv==0.13.9

WORKDIR /src
# The locked dependencies first, in their own layer: a code change does not reinstall them.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --locked --no-install-project --no-editable
# No extras: `embedded` (broker and Redis binaries) is for laptops and tests, `dev` for CI.
# uv compiles the bytecode here, because the root filesystem is read-only at run time.
COPY compaction_worker/ compaction_worker/
RUN uv sync --locked --no-editable


FROM python:3.11-slim-bookworm

# A fixed numeric id, so Kubernetes' runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 10001 worker \
    && useradd --system --uid 10001 --gid worker --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin worker

COPY --from=build /opt/venv /opt/venv

# LITELLM_LOCAL_MODEL_COST_MAP: use the model registry bundled with LiteLLM instead of
# fetching it at import time (workers may have no egress, and start-up must not depend on it).
# HOME=/tmp: the only writable place when the root filesystem is read-only.
ENV PATH="/opt/venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    HOME=/tmp \
    COMPACTION_HEALTH__ENABLED=true \
    COMPACTION_HEALTH__HOST=0.0.0.0 \
    COMPACTION_HEALTH__PORT=8080

EXPOSE 8080

# /livez on the configured port: 200 while the worker's loops beat, else the check fails.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['COMPACTION_HEALTH__PORT'] + '/livez', timeout=4)"]

WORKDIR /tmp
USER 10001:10001

# Exec form: the worker is PID 1 and gets SIGTERM itself, then drains for
# COMPACTION_WORKER__SHUTDOWN_GRACE_SECONDS (20 s by default); give `docker stop` more
# than that (--stop-timeout 30, or stop_grace_period in compose).
ENTRYPOINT ["compaction-worker"]
CMD ["run"]
