# syntax=docker/dockerfile:1
# The Tandem operator image (docs/design/006-install.md).
#
# - Runtime: distroless Python 3.11 on Debian 12, `nonroot` variant (UID/GID 65532): no shell, no package
#   manager. The builder is plain Debian 12, so the venv's interpreter path (/usr/bin/python3.11) is the
#   same in both stages.
# - Dependencies come only from requirements.lock with --require-hashes and --only-binary (no sdist
#   builds, no unhashed download); the tandem package itself is built without build isolation from the
#   locked setuptools/wheel and without an index.
# - Bytecode is compiled at build time (hash-based .pyc, independent of file times), so the read-only root
#   filesystem never needs a write (the chart also sets PYTHONDONTWRITEBYTECODE=1).
# - The release pipeline pins both base images by digest (--build-arg BUILDER_IMAGE=...@sha256:...,
#   RUNTIME_IMAGE=...@sha256:...) and publishes the image by digest, with SBOM and signature (S-SUP-03).
ARG BUILDER_IMAGE=docker.io/library/debian:12-slim
ARG RUNTIME_IMAGE=gcr.io/distroless/python3-debian12:nonroot

FROM ${BUILDER_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_NO_INPUT=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
# Point the venv at /usr/bin/python3.11, which both stages have under that exact name.
RUN python3 -m venv /opt/tandem \
 && ln -sf /usr/bin/python3.11 /opt/tandem/bin/python3 \
 && test "$(/opt/tandem/bin/python -c 'import sys; print(sys.version_info[:2])')" = "(3, 11)"
COPY requirements.lock /tmp/requirements.lock
RUN /opt/tandem/bin/pip install --require-hashes --no-deps --only-binary=:all: -r /tmp/requirements.lock
COPY pyproject.toml README.md /src/
COPY operator /src/operator
RUN /opt/tandem/bin/pip install --no-deps --no-build-isolation --no-index /src \
 && /opt/tandem/bin/pip uninstall -y pip setuptools wheel \
 && python3 -m compileall -q -f -j 0 --invalidation-mode unchecked-hash /opt/tandem/lib/python3.11/site-packages \
 && /opt/tandem/bin/python -c "import tandem.cli, kopf, kubernetes"

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="tandem-operator" \
      org.opencontainers.image.description="Kubernetes operator for prefill/decode LLM inference fleets on AMD GPUs" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["tandem", "run"]
