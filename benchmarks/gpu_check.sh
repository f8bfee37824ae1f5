#!/usr/bin/env bash
# benchmarks/gpu_check.sh [--smoke]: every GPU figure issue 13 asks, in one run of about 9 minutes.
#
#   1. dual matching at Pythia-160M shape (bf16, 4k/8k/16k tokens): s/step against the plain training step of
#      the same model, batch and dtype (learned_step_cost.py, interleaved, median of 5, each ratio's range),
#      recompute=block and weights, peak GPU memory of each column;
#   2. the same at Pythia-1.4B shape (2k/8k tokens, median of 3);
#   3. one weight-matching sweep at Pythia-1.4B shape (weight_matching_scale.py, products on the GPU): s/sweep,
#      its floor, peak RSS and peak GPU memory;
#   4. the same at Llama-2-7B shape with bf16 cost products;
#   5. one weight matching of a Pythia-410M-shape pair (2 layers) on the CPU at 1 and all threads and with the
#      products on the GPU (wm_devices.py): which results are bit for bit the same;
#   6. the device tests (tests/test_devices.py, tests/test_streaming.py) with the GPU visible.
#
# The random checkpoints are built on the machine (under $WORK, default runs/gpu_check; 1.4B: 2 x 2.8 GB,
# 7B: 2 x 13.5 GB, written in a step of its own). Each step has its own timeout (STEP_S seconds each, printed); a step stopped by it still
# leaves what it printed (the weight sweeps log every part read with its time and RSS). Results: one file per
# step under $OUT (default ./gpu_check_out), and $OUT/summary.txt (each step's exit status, seconds and result
# lines); each benchmark's record goes to $OUT/STEP.json too (record.py's schema), never into benchmarks/results/
# (a device machine returns $OUT alone; a smoke run must not touch the committed figures). Run from the
# repository root with the venv's python first on PATH (or PYTHON=...).
#
#   bash benchmarks/gpu_check.sh            # on a GPU machine: the figures
#   bash benchmarks/gpu_check.sh --smoke    # on the CPU at tiny shapes (1 layer, 32 tokens): the script works
set -u
cd "$(dirname "$0")/.."
SMOKE=0
[ "${1:-}" = "--smoke" ] && SMOKE=1
PY=${PYTHON:-python}
OUT=${OUT:-$PWD/gpu_check_out}
WORK=${WORK:-runs/gpu_check}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" TQDM_DISABLE=1
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

if [ $SMOKE = 1 ]; then
    DEV=cpu THREADS=1
    SC="--layers 1 --seq 32 --batches 1 --steps 1 --warmup 0"   # step cost, both shapes
    SC160=$SC SC14=$SC S14=pythia-160m   # the 1.4B step at 160M width: the same code, a quarter of the time
    WM14="--shape pythia-70m --layers 1" WM7="--shape pythia-70m --layers 1"
    T160=300 T14=300 TW14=300 TW7W=300 TW7=300 TWD=300 TT=600
else
    DEV=cuda THREADS=$(nproc --all) S14=pythia-1.4b
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
        echo "gpu_check: no GPU visible (use --smoke on the CPU)" >&2
        exit 2
    fi
    SC160="--seq 512 --batches 8,16,32 --steps 5 --warmup 2"
    SC14="--seq 512 --batches 4,16 --steps 3 --warmup 1"
    WM14="--shape pythia-1.4b" WM7="--shape llama-2-7b"
    T160=${T160:-90} T14=${T14:-140} TW14=${TW14:-70} TW7W=${TW7W:-90} TW7=${TW7:-170}   # 560 s in all
    TWD=${TWD:-60} TT=${TT:-90}
fi

{
    date -u
    git log -1 --format='commit %h %s' 2>/dev/null
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    echo "cores $(nproc), smoke $SMOKE, device $DEV"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >> "$SUMMARY"

step() {  # step NAME TIMEOUT_S ARGS...: run one measurement, log it, note its status and result lines
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "== $name (timeout ${limit}s): $*" | tee -a "$SUMMARY"
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "   rc $rc$([ $rc = 124 ] && echo ' (timed out)') in $((SECONDS - t0)) s" | tee -a "$SUMMARY"
    grep -E '^ +[0-9]+ +[0-9]+ |ratio range|peak|sweep / floor|per sweep|similarity|Error|^\{"device|passed|failed' "$OUT/$name.txt" \
        | sed 's/^/   /' >> "$SUMMARY"
}

step dual_160m $T160 "$PY" benchmarks/learned_step_cost.py --shape pythia-160m --method dual --dtype bfloat16 \
    --recompute block,weights --threads "$THREADS" --device $DEV --spread $SC160 --results "$OUT/dual_160m.json"
step dual_1.4b $T14 "$PY" benchmarks/learned_step_cost.py --shape $S14 --method dual --dtype bfloat16 \
    --recompute block,weights --threads "$THREADS" --device $DEV --spread $SC14 --results "$OUT/dual_1.4b.json"
WMDEV=$([ $DEV = cuda ] && echo "--device cuda")
step wm_1.4b $TW14 "$PY" benchmarks/weight_matching_scale.py $WM14 --folder "$WORK" --threads "$THREADS" $WMDEV \
    --results "$OUT/wm_1.4b.json"
step wm_7b_write $TW7W "$PY" benchmarks/weight_matching_scale.py $WM7 --folder "$WORK" --threads "$THREADS" --write-only
step wm_7b $TW7 "$PY" benchmarks/weight_matching_scale.py $WM7 --folder "$WORK" --threads "$THREADS" \
    --cost-products bfloat16 $WMDEV --results "$OUT/wm_7b.json"
WDDEV=$([ $DEV = cuda ] && echo "--device cuda")
WDSHAPE=$([ $SMOKE = 1 ] && echo "pythia-70m" || echo "pythia-410m")
step wm_devices $TWD "$PY" benchmarks/wm_devices.py --shape $WDSHAPE --layers 2 --folder "$WORK" \
    --threads "1,$THREADS" $WDDEV --json "$OUT/wm_devices.json" --results "$OUT/wm_devices.record.json"
step tests_device $TT "$PY" -m pytest -p no:cacheprovider tests/test_devices.py tests/test_streaming.py
echo "done $(date -u)" >> "$SUMMARY"
