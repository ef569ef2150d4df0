# syntax=docker/dockerfile:1
#
# The CleverAgents skill worker image. One image runs every app service of
# docker-compose.yml: the worker (the default command), Flower, the metrics exporter and
# the `cleveragents` producer commands. See docs/deployment.md.
#
#   docker build -t cleveragents:local .
#   docker run --rm --env-file worker.env cleveragents:local
#
# worker.env holds CLEVERAGENTS_BROKER_URL=redis://worker:PASSWORD@HOST:6379/0 and the worker's
# other settings (docs/deployment.md): the password stays off the command line.

# ---- builder: a wheel of the project and of every dependency -------------------------------
FROM python:3.11-slim AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
COPY . .
# Every dependency ships binary wheels for linux/amd64 and linux/arm64 (pydantic-core,
# jsonschema-rs), so no compiler is needed even here. The pip cache is a BuildKit cache
# mount: it speeds up rebuilds and never lands in a layer.
# With the otel extra's (OpenTelemetry traces, docs/operations.md "Traces"): off unless the
# OTEL_* variables ask for them.
RUN --mount=type=cache,target=/root/.cache/pip \
    pip wheel . ".[otel]" --wheel-dir /wheels

# ---- final: the wheels installed into a clean slim image, run as a non-root user -----------
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore

# bubblewrap makes the sandboxes of sandboxed tools (`sandbox:` in a skill file, or
# CLEVERAGENTS_SANDBOX=1; docs/runtime.md "Sandboxed tools"). The container must allow user
# namespaces for it (docs/deployment.md); without them a sandboxed tool fails with
# sandbox_unavailable, and never runs unsandboxed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

# A fixed uid/gid (10001), so that volumes and Kubernetes' runAsNonRoot can rely on it.
# /app is the working directory (the embedded home, .cleveragents, and the example note
# tools write below it); /data holds Flower's state when a volume is mounted there, and a
# new named volume takes its owner from the image.
RUN groupadd --system --gid 10001 cleveragents \
    && useradd --system --uid 10001 --gid cleveragents --no-log-init \
        --home-dir /home/cleveragents --create-home --shell /usr/sbin/nologin cleveragents \
    && install -d -o 10001 -g 10001 /app /data

# Only the wheels, only from the builder (bind-mounted, so no copy of them stays in the
# image), with no index and no pip cache. The bundled example catalogue is the installed
# `examples` package; the worker uses it unless /app/skills or CLEVERAGENTS_CATALOGUE says
# otherwise.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels "cleveragents[otel]"

WORKDIR /app
USER 10001:10001

# Health checks are in docker-compose.yml: each service there knows how to probe itself.
CMD ["celery", "-A", "cleveragents.worker", "worker", "--loglevel", "INFO"]
