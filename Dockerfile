# Lantern in a container: serves every archive in the model store volume.
#
#   docker build -t lantern .
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:8081:8081 -p 127.0.0.1:8082:8082 \
#       -v "$PWD/model_store:/home/lantern/model_store:ro" lantern
#
# Inside the container the server binds 0.0.0.0 (the LANTERN_*_ADDRESS variables below); publish
# the ports on 127.0.0.1 as above unless a proxy in front of it does authentication.
#
# torch comes from PyPI as pyproject.toml pins it, which on x86-64 Linux brings CUDA libraries.
# Where the PyTorch CPU wheel index is reachable, a much smaller CPU-only image is
#   docker build --build-arg PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu -t lantern .

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY archiver ./archiver
COPY handlers ./handlers
COPY serve ./serve
ARG PIP_EXTRA_INDEX_URL
# DL3013 asks for pinned versions: "." is this project, whose dependencies pyproject.toml pins.
# hadolint ignore=DL3013
RUN pip install ".[uvicorn]"

FROM python:${PYTHON_VERSION}-slim
RUN groupadd --gid 10001 lantern \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin lantern
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    LANTERN_INFERENCE_ADDRESS=http://0.0.0.0:8080 \
    LANTERN_MANAGEMENT_ADDRESS=http://0.0.0.0:8081 \
    LANTERN_METRICS_ADDRESS=http://0.0.0.0:8082 \
    LANTERN_GRPC_INFERENCE_ADDRESS=0.0.0.0 \
    LANTERN_GRPC_MANAGEMENT_ADDRESS=0.0.0.0
# Numeric, so that runtimes enforcing non-root (Kubernetes runAsNonRoot) can verify it.
USER 10001:10001
WORKDIR /home/lantern
RUN mkdir model_store logs
VOLUME ["/home/lantern/model_store"]
EXPOSE 8080 8081 8082 7070 7071

# /ping never needs a token; it answers 500 while a model lacks its minimum of ready workers.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as r; a = os.environ.get('LANTERN_INFERENCE_ADDRESS', 'http://0.0.0.0:8080'); r.urlopen(a.replace('0.0.0.0', '127.0.0.1') + '/ping', timeout=4)"]

# Token auth is on: the keys are in /home/lantern/key_file.json (docker exec CONTAINER cat
# key_file.json). Override the arguments to change that: docker run ... lantern
#   --model-store model_store --models all --disable-token-auth
ENTRYPOINT ["serve", "start", "--foreground"]
CMD ["--model-store", "model_store", "--models", "all"]
