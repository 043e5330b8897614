#!/usr/bin/env bash
# The four benchmarks on a Qwen3-8B-shaped random-init model in bf16 on one CUDA GPU, in under
# 8 minutes (sized for one H100/H200-class GPU with >= 80 GB; run from anywhere in the repo):
#
#   bash bench/gpu.sh                  # all 36 decoder layers of Qwen3-8B's shapes
#   LAYERS=12 bash bench/gpu.sh        # fewer decoder layers, for a slower GPU: per-layer costs are
#                                      # unchanged, the lm_head's share of the time grows
#
# Environment: DEVICE (cuda), SHAPE (qwen3-8b; any conf/backbone name with shapes), LAYERS (36),
# OUT (bench/results/gpu), ATLAS_CACHE (a temporary folder; the atlas is built by the first
# script and loaded by the next ones), PYTHON (the interpreter: `python3`, else `python`, on the PATH;
# many CUDA images have no `python`).
#
# Steps and wall-clock caps (seconds; at most 40 + 135 + 150 + 130 plus 5 s grace each = 475):
#   storage     configs only (+ real micro atlases on the CPU)                          40
#   train_step  batch 2 x 1024 tokens; base, lora, atlas, atlas_prev; 2 warm-up + 5 rounds 135
#   decode      32 prompt + 32 new tokens, batch 1 and 32; all six variants; 1 + 3 rounds  150
#   eval_cost   (a) KL vs forward on 32 x (64 + 64) tokens, 1 + 3 rounds;
#               (b) micro sweep of 3 runs on 64 items per domain and 32 code problems     130
# A capped script is interrupted (SIGINT) and keeps what it had written: every script rewrites
# its JSON after each completed part ("complete": false until the end).
set -uo pipefail
cd "$(dirname "$0")/.."

DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-qwen3-8b}
LAYERS=${LAYERS:-36}
OUT=${OUT:-bench/results/gpu}
ATLAS_CACHE=${ATLAS_CACHE:-$(mktemp -d -t atlas-bench-XXXXXX)}
PYTHON=${PYTHON:-$(command -v python3 || command -v python)}
[ -n "$PYTHON" ] || { echo "no python3 or python on the PATH; set PYTHON"; exit 1; }
COMMON=(--device "$DEVICE" --dtype bfloat16 --shape "$SHAPE" --layers "$LAYERS" --atlas-cache "$ATLAS_CACHE"
        --atlas-tokens 2048)
mkdir -p "$OUT"
start=$SECONDS
failed=0

run() {  # run <cap seconds> <module> [args...]
    local cap=$1 module=$2
    shift 2
    echo "== [$((SECONDS - start)) s] $PYTHON -m $module $* (cap ${cap} s)"
    timeout --signal=INT --kill-after=5 "$cap" "$PYTHON" -m "$module" "$@"
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "!! $module exited with status $rc (124: hit its cap)"
        failed=1
    fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())" || exit 1

run 40 bench.storage --out "$OUT/storage.json"
run 135 bench.train_step "${COMMON[@]}" --batch 2 --seq 1024 --repeats 5 --warmup 2 \
    --variants base,lora,atlas,atlas_prev --out "$OUT/train_step.json"
run 150 bench.decode "${COMMON[@]}" --batch-sizes 1,32 --new-tokens 32 --prompt-len 32 --repeats 3 --warmup 1 \
    --out "$OUT/decode.json"
run 130 bench.eval_cost "${COMMON[@]}" --parts a,b --repeats 3 --warmup 1 --kl-batch 32 \
    --runs 3 --max-items 64 --max-problems 32 --out "$OUT/eval_cost.json"

echo "== done in $((SECONDS - start)) s; results in $OUT"
exit "$failed"
