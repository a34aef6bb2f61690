#!/usr/bin/env bash
# The end-to-end demo on the built-in defaults. $1: path of the sidco executable.
set -euo pipefail
SIDCO="$1"
echo "== compressor benchmark (1,048,576 fp32 elements, CPU) =="
"$SIDCO" bench --size 1048576 --densities 0.1,0.01,0.001 --device cpu --repeats 5
