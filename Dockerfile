# syntax=docker/dockerfile:1
# One image, two entry points:
#   venturi worker myapp.jobs:make_worker   a worker (and the other `venturi` commands)
#   venturi-operator --all-namespaces       the operator (what charts/venturi runs)
# Build: docker build -t venturi:0.1.0 .
# It runs as uid/gid 10001 and writes nothing to its root filesystem (bytecode is compiled at
# build time), so it runs with readOnlyRootFilesystem; /tmp is the only scratch place it may need.
# Workers' code: build FROM this image and COPY your package into /app (the working directory,
# which `venturi worker` puts on sys.path); see examples/.

# The base, pinned to a patch release. For byte-for-byte reproducible builds pin its digest too:
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:... .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venturi
WORKDIR /src
# Only what the package needs (and .dockerignore lets in): the metadata, then the sources.
COPY pyproject.toml README.md ./
COPY runtime ./runtime
COPY operator ./operator
# The same install the tests run (scripts/test), without the dev extra and not editable.
# pip compiles the bytecode here, so the read-only image never needs to write it. pip and
# setuptools are not needed at run time: they leave the final image.
RUN /opt/venturi/bin/python -m pip install '.[operator,metrics,encryption,schedules]' \
 && /opt/venturi/bin/python -m pip uninstall --yes pip setuptools \
 && /opt/venturi/bin/venturi --help >/dev/null \
 && /opt/venturi/bin/venturi-operator --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="venturi" \
      org.opencontainers.image.description="Typed background jobs on PostgreSQL: workers (venturi) and the Kubernetes operator (venturi-operator)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 venturi \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin venturi
COPY --from=build /opt/venturi /opt/venturi
ENV PATH=/opt/venturi/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /app
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
# 8080: the operator's /metrics; 8081: its kopf liveness endpoint (/healthz).
EXPOSE 8080 8081
CMD ["venturi", "--help"]
