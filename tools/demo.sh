#!/usr/bin/env bash
# The end-to-end demo on the built-in defaults: capture a small trace from real training,
# replay it through the compressors, project it on a cluster and compare every compressor on a
# GPU cluster and for an LLM under sharded data parallelism, sweep a small grid, run a short real emulation on shaped links (root only), train
# a toy with compressed gradients and project its time to accuracy, then serve the dashboard on
# the demo's own trace and run. Each step ends with one line (-> ...) saying what it showed.
# $1: path of the sidco executable. Outputs: demo-out/ and the store runs/results.sqlite.
set -euo pipefail
SIDCO="$1"
PY="$(dirname "$SIDCO")/python"
STORE="${SIDCO_DEMO_STORE:-runs/results.sqlite}"
TRACE=demo-out/resnet20
PORT="${SIDCO_DEMO_PORT:-8050}"
mkdir -p demo-out
step() { printf '\n== [%s] %s ==\n' "$(date +%H:%M:%S)" "$*"; }
say() { printf -- '-> %s\n' "$*"; }

step "1/9 capture: ResNet-20, 2 simulated workers, 20 steps, every 5th recorded"
"$SIDCO" capture --workload resnet20 --workers 2 --iterations 20 --every 5 --width 0.5 --threads 1 \
    --out "$TRACE" --force --store "$STORE" | tee demo-out/capture.txt
TRACE_ID=$(sed -n 's/^trace \([0-9]*\):.*/\1/p' demo-out/capture.txt)
say "real training on this CPU recorded its gradients and per-layer times as trace #$TRACE_ID ($TRACE)"

step "2/9 replay: every compressor at densities 0.01 and 0.001 (the compression costs the projections use)"
"$SIDCO" replay "$TRACE" --compressors all --densities 0.01,0.001 \
    --threads 1 --store "$STORE"
say "each compressor ran on the recorded gradients: its achieved density, error and cost per call on this CPU" \
    "(fp16, bf16, powersgd ignore the density: one row each)"

step "3/9 simulate: the trace on 8 nodes, 10 Gbit/s, 50 us, SIDCo-E at 0.001 (timeline: demo-out/timeline.json)"
"$SIDCO" simulate --trace "$TRACE" --nodes 8 --bandwidth 10Gbit --latency 50us --compressor sidco-e \
    --density 0.001 --timeline demo-out/timeline.json --store "$STORE"
"$SIDCO" simulate --trace "$TRACE" --nodes 8 --bandwidth 10Gbit --latency 50us --compressor none \
    --store "$STORE" --json > demo-out/simulate-none.json
say "$("$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
share = r["comm_s"] / r["iteration_s"] if r["iteration_s"] else 0.0
verdict = "so compression cannot pay much here" if share < 0.2 else "so compression can pay"
print(f"on this CPU, communication is {share:.1%} of the iteration without compression ({verdict});"
      " step 4 asks the same question of 8 A100s")' demo-out/simulate-none.json)"

step "4/9 compare: BERT-base on 8 A100s at 10 Gbit/s, every compressor at 0.01 and 0.001, ranked"
"$SIDCO" compare --layout bert-base --device a100 --nodes 8 --bandwidth 10Gbit --densities 0.01,0.001 \
    --store "$STORE" | tee demo-out/compare.txt
say "the same question on 8 A100s at 10 Gbit/s (speed-ups over none in the table): $(sed -n '/^verdict: /,$p' demo-out/compare.txt | tr -s ' \n' ' ')"

step "5/9 compare an LLM: Llama-3.1-8B from its config, HSDP on 4 nodes of 8 H100s, at 100 Gbit/s and 10 Gbit/s"
LLM=()
for BW in 100Gbit 10Gbit; do
    "$SIDCO" compare --model llama-3.1-8b --device h100 --nodes 4 --gpus-per-node 8 --parallel hsdp \
        --batch-size 2 --bandwidth "$BW" --compressors none,bf16,powersgd,topk,sidco-e --densities 0.01 \
        --store "$STORE" | tee "demo-out/compare-llm-$BW.txt"
    LLM+=("at $BW, $(sed -n '/^verdict: /,$p' "demo-out/compare-llm-$BW.txt" | tr -s ' \n' ' ' \
        | sed 's/^verdict: \([^;]*\);.*saves at most \([0-9.]*%\).*/\1 (compressing the replicate all-reduce saves at most \2 of the step)/')")
done
say "sharded training of an 8B model (memory per GPU and the collective each row replaces in the table): ${LLM[0]}; ${LLM[1]}"

step "6/9 sweep: the trace on 2..64 nodes x 1..100 Gbit/s x every compressor at 0.01 and 0.001"
"$SIDCO" sweep --trace "$TRACE" --nodes 2,4,8,16,32,64 --bandwidth 1Gbit,10Gbit,25Gbit,100Gbit \
    --compressors all --densities 0.01,0.001 --store "$STORE" --no-progress | tee demo-out/sweep.txt
say "$(awk '/^verdict per cluster/ {on = 1; next}
    on && /^[^ ]/ {on = 0}
    on && $2 == "verdict:" {total++; if ($3 == "compress" && $4 == "with") won++; if ($3 == "compress:") tied++; if ($3 == "don'"'"'t") dense++}
    END {printf "compress on %d of %d clusters of this CPU trace (with one clear choice on %d; on %d the best compressors cannot be told apart); on %d, don'"'"'t compress", won + tied, total, won, tied, dense}' \
    demo-out/sweep.txt)"

step "7/9 emulation: real gloo training on shaped links (needs root, ip, tc)"
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v tc >/dev/null; then
    if "$SIDCO" emulate --workers 2 --bandwidth 50Mbit --workload resnet20 --compressors none,sidco-e \
        --densities 0.01 --iterations 6 --warmup 2 --store "$STORE"; then
        say "measured iterations on a real 50 Mbit/s link beside the projection of the same run (error per row above)"
    else
        say "emulation failed (see above); continuing"
    fi
else
    say "skipped: not root or no ip/tc (run 'sudo make demo' for the emulation step)"
fi

step "8/9 time to accuracy (a toy): ResNet-20 (width 0.25), 2 workers, 40 steps per compressor, 3 seeds, projected on 8 nodes at 100 Mbit/s"
"$SIDCO" converge --workload resnet20 --width 0.25 --workers 2 --iterations 40 --eval-every 10 \
    --compressors none,topk,sidco-e --densities 0.01 --seeds 3 --threads 1 --store "$STORE" | tee demo-out/converge.txt
RUN=$(sed -n 's/^convergence \([0-9]*\):.*/\1/p' demo-out/converge.txt)
"$SIDCO" tta --convergence "$RUN" --nodes 8 --bandwidth 100Mbit --target-accuracy 0.25 --store "$STORE" \
    | tee demo-out/tta.txt
say "a toy: 40 steps of a small model show the pipeline (train, evaluate, project), not which compressor" \
    "converges best; a compressor that misses 0.25 here may reach it later. $(grep '^winner:' demo-out/tta.txt)" \
    "(8 nodes, 100 Mbit/s). Real runs: sidco converge --iterations 2000"

step "9/9 dashboard (Ctrl-C stops it)"
URL="http://127.0.0.1:$PORT"
say "What-if on this demo's trace: $URL/?source=trace:$TRACE_ID&nodes=8&bandwidth=10Gbit&density=0.001"
say "Time to accuracy on run $RUN as in step 8: $URL/tta?run=$RUN&nodes=8&bandwidth=100Mbit&target=0.25"
exec "$SIDCO" dashboard --store "$STORE" --port "$PORT"
