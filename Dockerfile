# The image every shardline component runs in Kubernetes (charts/shardline): the gateway, the
# tokenizer, the stage workers and the converter Job. Not built in the workplace the chart was
# written in (no container engine there); see charts/shardline/README.md.
#
#   docker build -t shardline:0.1.0 .
#
# A CUDA runtime base: torch's wheel brings its own CUDA libraries, but the Triton kernels and
# CuPy's GEMV compile against the driver at run time. Ubuntu 24.04's Python is 3.12 (shardline
# needs 3.11 or 3.12).
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# gcc and Python's headers: Triton compiles its kernel launchers (C against Python.h) on first use.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev gcc \
    && rm -rf /var/lib/apt/lists/*

# A virtualenv: the system Python refuses pip installs (PEP 668). Its bin/ holds `python` and
# `shardline`, the commands the chart runs.
RUN python3 -m venv /opt/shardline
ENV PATH=/opt/shardline/bin:$PATH \
    PYTHONUNBUFFERED=1

WORKDIR /src
COPY . .
# The gpu extra brings CuPy (cupy-cuda12x) for the batch-1 CUDA GEMV; without it cuBLAS runs.
RUN pip install --no-cache-dir ".[gpu]" && rm -rf /src

# The chart's pods run as uid 1000 (podSecurityContext); the base image's own uid-1000 user
# is replaced by one named for what runs.
RUN userdel --remove ubuntu && useradd --uid 1000 --create-home shardline
USER 1000:1000
WORKDIR /home/shardline
