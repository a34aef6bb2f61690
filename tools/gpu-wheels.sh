#!/usr/bin/env bash
# Fetch the pure-Python wheels the GPU machine lacks (its image has torch, numpy, scipy,
# safetensors, tqdm, pytest, hypothesis, but not simpy, plotly, dash) into .gpu-wheels/
# (ignored by git), for tools/gpu-check.sh to install offline there. Run once, here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mkdir -p .gpu-wheels
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
    --dest .gpu-wheels simpy==4.1.2 plotly==7.1.0 dash==4.4.1 flask==3.1.3 blinker==1.9.0 \
    itsdangerous==2.2.0 retrying==1.4.2 nest-asyncio==1.6.0 diskcache==5.6.3
ls -1 .gpu-wheels
