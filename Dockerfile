# zerocalc on a GPU node: the API, the web page and the measure runner in one container.
#
#   docker build -t zerocalc .
#   export ZEROCALC_API_KEY="$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
#   docker run --gpus all --shm-size=8g -p 127.0.0.1:8000:8000 -v zerocalc-data:/data \
#     -e ZEROCALC_API_KEY zerocalc
#
# In a container every request arrives over the network: without ZEROCALC_API_KEY the measure
# endpoints (real GPU jobs) answer 403; with it they need the X-API-Key header.
# Swagger UI and ReDoc come with the project's dependencies (fastapi-offline), so /docs and
# /redoc work on a node without internet.
#
# The base image brings CUDA 12.8, cuDNN 9 and a CUDA build of torch (what /v1/measure runs);
# the project is installed on top exactly as the README installs it, minus the README's torch
# pin, so the base image's CUDA torch stays (tests/test_dockerfile.py checks both lines agree).
FROM pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    ZEROCALC_DATA_DIR=/data

WORKDIR /app

# An unprivileged user owns nothing but its home (caches) and the data volume.
RUN groupadd --system --gid 10001 zerocalc \
    && useradd --system --uid 10001 --gid zerocalc --create-home --home-dir /home/zerocalc \
        --shell /usr/sbin/nologin zerocalc \
    && mkdir -p /data \
    && chown zerocalc:zerocalc /data

COPY pyproject.toml README.md ./
COPY calculators ./calculators
COPY measure ./measure
COPY app ./app

RUN python3 -m pip install --no-cache-dir -e ".[measure,hf]"

USER 10001:10001

# The SQLite store of measurements (ZEROCALC_DATA_DIR) outlives the container.
VOLUME ["/data"]
EXPOSE 8000

# /healthz answers without touching the GPU; python's urllib, so no curl in the image.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python3", "-c", "import sys, urllib.request; r = urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4); sys.exit(0 if r.status == 200 else 1)"]

# One worker: one CUDA context and one job runner (several would each hold their own).
CMD ["python3", "-m", "uvicorn", "app.main:app", "--host", "0.0.0.0", "--port", "8000", "--workers", "1"]
