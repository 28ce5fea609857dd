# modelplex: a multi-stage, non-root image. `docker build -t modelplex:0.1.0 .`
# The builder compiles the project into a wheel (the span recorder is C) and installs that wheel with its
# pinned dependencies into a venv; the runtime stage copies only that venv (no compiler, no pip cache, no
# sources) and runs as an unprivileged user. tests/deploy/test_image_build.py runs these RUN steps in a
# clean venv (there is no Docker engine in CI), so keep them plain shell.
# EXTRAS picks backends: "onnx" (default), or e.g. "onnx,openvino", "all" (torch: a much larger image).

# Both stages must use the same Python: the venv built in one runs in the other.
FROM python:3.11-slim AS builder
ARG EXTRAS=onnx
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The slim image has Python's headers but no C compiler; only this stage gets one.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY platform ./platform
COPY backends ./backends
COPY ensembles ./ensembles
COPY multilora ./multilora
COPY admin ./admin
RUN pip wheel --no-deps --wheel-dir /wheels .
# The wheel by its path, never `modelplex[...]` by name: an index could hold another project of that name.
RUN python -m venv /opt/venv && /opt/venv/bin/pip install "$(ls /wheels/modelplex-*.whl)[${EXTRAS}]"

FROM python:3.11-slim AS runtime
ARG EXTRAS=onnx
# native_gpu compiles its CPU ops (decode attention, fused layer ops) at the first model load (-march=native,
# so for the CPU it runs on); without a compiler it falls back to the torch path, about 2x slower to decode.
RUN if echo ",${EXTRAS}," | grep -qE ',(all|native_gpu),'; then \
        apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*; \
    fi
RUN groupadd --system --gid 10001 modelplex \
    && useradd --system --uid 10001 --gid modelplex --home-dir /home/modelplex --create-home modelplex
COPY --from=builder /opt/venv /opt/venv
# The ops' build cache: /tmp is writable in the pod (an emptyDir; the root filesystem is read-only).
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
USER 10001:10001
WORKDIR /home/modelplex
EXPOSE 8000 8001 8002
# Exec form: modelplex is PID 1 and gets SIGTERM itself (graceful drain, --exit-timeout-secs).
ENTRYPOINT ["modelplex", "serve"]
CMD ["--model-repository", "/models"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=600s \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=2)"]
