#!/usr/bin/env bash
# GPU check: run on a machine with one CUDA GPU, from the repository root or anywhere.
#   tools/gpu-check.sh OUTDIR
# Installs what the machine lacks from .gpu-wheels/ (offline; fill it here first with
# tools/gpu-wheels.sh), then runs the GPU-marked tests, `sidco bench --run-on cuda`,
# `sidco profile --run-on cuda` and `sidco profile --check`, writing into OUTDIR:
#   gpu-check.log        everything printed, with timings
#   bench-cuda.json      sidco bench rows (SIDCo fused and eager beside torch.topk: the topk row)
#   profile-cuda.json    the device profile (the --profile format; ship it as profiles/<device>.json)
#   check.txt            the cost model's error against that profile
#   results.sqlite       the results store holding the profile
# Each step has its own time limit; the whole script stays under about 7 minutes.
set -uo pipefail
OUT=${1:?usage: tools/gpu-check.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
exec > >(tee -a "$OUT/gpu-check.log") 2>&1
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 SIDCO_CACHE_DIR="$OUT/cache"
status=0
step() {  # step NAME LIMIT_S COMMAND...
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    echo "=== $name (limit ${limit}s) ==="
    timeout "$limit" "$@"
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - start)) s ==="
    [ "$rc" -eq 0 ] || status=1
}

echo "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/sidco-site \
        .gpu-wheels/*.whl || { echo "offline install failed"; exit 2; }
    export PYTHONPATH="/tmp/sidco-site:$PWD"
else
    echo "no .gpu-wheels/: run tools/gpu-wheels.sh on a machine with a registry first"
    export PYTHONPATH="$PWD"
fi
"$PY" -c "import torch, sys; ok = torch.cuda.is_available(); print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0) if ok else 'no GPU'); sys.exit(0 if ok else 3)" \
    || { echo "no CUDA device: nothing to check"; exit 3; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv || true

mapfile -t GPU_TESTS < <(grep -l "mark.gpu" tests/test_*.py)
step "GPU-marked tests" 150 "$PY" -m pytest -q -m gpu -p no:cacheprovider -p no:randomly "${GPU_TESTS[@]}"
step "sidco bench --run-on cuda" 60 "$PY" -m sidco bench --run-on cuda --size 26214400 --densities 0.01,0.001 \
    --repeats 10 --warmup 5 --json > "$OUT/bench-cuda.json"
step "sidco profile --run-on cuda" 180 "$PY" -m sidco profile --run-on cuda --sizes 2^16..2^26 \
    --densities 0.01,0.001 --warmup 5 --repeats 10 --store "$OUT/results.sqlite" --out "$OUT/profile-cuda.json"
step "sidco profile --check" 30 "$PY" -m sidco profile --check --profile "$OUT/profile-cuda.json" \
    --store "$OUT/results.sqlite" > "$OUT/check.txt"
tail -n 20 "$OUT/check.txt"
echo "gpu-check finished: exit $status"
exit $status
