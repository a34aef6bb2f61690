#!/usr/bin/env bash
# The end-to-end demo on the built-in defaults: capture a small trace from real training,
# replay it through the compressors, project one scenario and sweep a small grid, run a short
# real emulation on shaped links (root only), train with compressed gradients and name the
# compressor that reaches the target accuracy first on the demo cluster, then serve the dashboard.
# $1: path of the sidco executable. Outputs: demo-out/ and the store runs/results.sqlite.
set -euo pipefail
SIDCO="$1"
STORE="${SIDCO_DEMO_STORE:-runs/results.sqlite}"
TRACE=demo-out/resnet20
PORT="${SIDCO_DEMO_PORT:-8050}"
mkdir -p demo-out
step() { printf '\n== [%s] %s ==\n' "$(date +%H:%M:%S)" "$*"; }

step "1/7 capture: ResNet-20, 2 simulated workers, 20 steps, every 5th recorded"
"$SIDCO" capture --workload resnet20 --workers 2 --iterations 20 --every 5 --width 0.5 --threads 1 \
    --out "$TRACE" --force --store "$STORE"

step "2/7 replay: every compressor at densities 0.01 and 0.001 (the compression costs the projections use)"
"$SIDCO" replay "$TRACE" --compressors all --densities 0.01,0.001 \
    --threads 1 --store "$STORE"

step "3/7 simulate: 8 nodes, 10 Gbit/s, 50 us, SIDCo-E at 0.001 (timeline: demo-out/timeline.json)"
"$SIDCO" simulate --trace "$TRACE" --nodes 8 --bandwidth 10Gbit --latency 50us --compressor sidco-e \
    --density 0.001 --timeline demo-out/timeline.json --store "$STORE"

step "4/7 sweep: 2..64 nodes x 1..100 Gbit/s x every compressor at 0.01 and 0.001"
"$SIDCO" sweep --trace "$TRACE" --nodes 2,4,8,16,32,64 --bandwidth 1Gbit,10Gbit,25Gbit,100Gbit \
    --compressors all --densities 0.01,0.001 --store "$STORE"

step "5/7 emulation: real gloo training on shaped links (needs root, ip, tc)"
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v tc >/dev/null; then
    "$SIDCO" emulate --workers 2 --bandwidth 50Mbit --workload resnet20 --compressors none,sidco-e \
        --densities 0.01 --iterations 6 --warmup 2 --store "$STORE" \
        || echo "emulation failed (see above); continuing with the dashboard"
else
    echo "skipped: not root or no ip/tc (run 'sudo make demo' for the emulation step)"
fi

step "6/7 time to accuracy: ResNet-20 (width 0.25), 2 workers, 40 steps per compressor, 3 seeds, projected on 8 nodes at 100 Mbit/s"
"$SIDCO" converge --workload resnet20 --width 0.25 --workers 2 --iterations 40 --eval-every 10 \
    --compressors none,topk,sidco-e --densities 0.01 --seeds 3 --threads 1 --store "$STORE" | tee demo-out/converge.txt
RUN=$(sed -n 's/^convergence \([0-9]*\):.*/\1/p' demo-out/converge.txt)
"$SIDCO" tta --convergence "$RUN" --nodes 8 --bandwidth 100Mbit --target-accuracy 0.25 --store "$STORE" \
    | tee demo-out/tta.txt
echo "time-to-accuracy $(grep '^winner:' demo-out/tta.txt) (8 nodes, 100 Mbit/s; page /tta of the dashboard)"

step "7/7 dashboard"
exec "$SIDCO" dashboard --store "$STORE" --port "$PORT"
