#!/usr/bin/env bash
# The two-GPU session of issue 19: the tests that need two GPUs, then the benchmark of one GPU
# against layers spread over two (accelerate's device_map) and tensor parallel over two
# (transformers' tp_plan under torchrun), each with and without n-gram speculation, on a random
# checkpoint of the 8B shape. Run from the repository root on a machine with two GPUs:
#
#     bash benchmarks/parallel_gpus.sh [OUT_DIR [STEP...]]   # default OUT_DIR: ./parallel-out
#
# STEPs (default: all, in this order): tests single pipeline capped tp-none tp-ngram tp-eager
# table; also single-unfused and tp-unfused (the fused decoder kernels off: an A/B on one
# lease). The 8B shape needs more than one 10-minute device call for all of them: give some steps
# per call (the checkpoint is written once, by the first step that needs it, and kept in CKPT
# while the machine is held). Each step writes OUT_DIR/<step>.json and its log
# OUT_DIR/<step>.log; a step that fails or runs past STEP_TIMEOUT seconds (default 420) leaves no
# JSON (and the script's exit status 1), and the others still run. MODEL (default
# random-llama-8b), BATCH_SIZES (1,32), MAX_TOKENS (128), CAPPED (accelerate's max_memory for the
# capped pipeline) and CKPT (default /tmp/specdec-<MODEL>) can be set in the environment.
set -uo pipefail

OUT=${1:-parallel-out}
shift || true
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(tests single pipeline capped tp-none tp-ngram tp-eager table)
MODEL=${MODEL:-random-llama-8b}
BATCH_SIZES=${BATCH_SIZES:-1,32}
MAX_TOKENS=${MAX_TOKENS:-128}
CKPT=${CKPT:-/tmp/specdec-$MODEL}
CAPPED=${CAPPED:-'{"0": "6GiB", "1": "60GiB"}'}  # (the 8B's weights: 16 GB)
STEP_TIMEOUT=${STEP_TIMEOUT:-420}
PY=${PYTHON:-python3}
mkdir -p "$OUT"

gpus=$($PY -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -lt 2 ]; then
    echo "error: this script needs two GPUs, found $gpus" >&2
    exit 2
fi

checkpoint() {  # one random checkpoint: every layout on the same weights and prompts
    [ -f "$CKPT/config.json" ] || $PY benchmarks/parallel.py save --model "$MODEL" --dir "$CKPT"
}
common=(--model "$CKPT" --batch-sizes "$BATCH_SIZES" --max-tokens "$MAX_TOKENS")
tp=(timeout "$STEP_TIMEOUT" torchrun --standalone --nproc-per-node 2 benchmarks/parallel.py run
    --layout tp "${common[@]}")

step() {
    local name=$1
    case $name in
        # The tests whose two-GPU cases skip elsewhere: tensor parallel over NCCL against Hugging
        # Face (CUDA graphs on every rank, n-gram and draft-head drafts), and a model split over
        # two GPUs with its KV pools beside its layers, every proposer on it.
        tests) timeout "$STEP_TIMEOUT" $PY -m pytest -q -rs \
            tests/engine/runner/test_tensor_parallel.py tests/engine/runner/test_spread_model.py \
            tests/engine/test_llm_spread.py ;;
        single|pipeline) checkpoint && timeout "$STEP_TIMEOUT" $PY benchmarks/parallel.py run \
            --layout "$name" "${common[@]}" --json "$OUT/$name.json" ;;
        # The first GPU's memory capped below the model (issue 19: a target too large for one
        # GPU's memory setting runs with speculation, and its greedy text equals one GPU's).
        capped) checkpoint && timeout "$STEP_TIMEOUT" $PY benchmarks/parallel.py run \
            --layout pipeline "${common[@]}" --max-memory "$CAPPED" --json "$OUT/capped.json" ;;
        # Tensor parallel with CUDA graphs (every rank replaying the graphs rank 0 chose), then
        # eager.
        tp-none|tp-ngram) checkpoint && "${tp[@]}" --methods "${name#tp-}" \
            --json "$OUT/$name.json" ;;
        tp-eager) checkpoint && "${tp[@]}" --methods none --enforce-eager \
            --json "$OUT/$name.json" ;;
        # transformers' own RMSNorm and rotary operations (engine/runner/fused_ops.py off)
        single-unfused) checkpoint && timeout "$STEP_TIMEOUT" $PY benchmarks/parallel.py run \
            --layout single "${common[@]}" --methods none --no-fused-ops --json "$OUT/$name.json" ;;
        tp-unfused) checkpoint && "${tp[@]}" --methods none --no-fused-ops \
            --json "$OUT/$name.json" ;;
        table) $PY benchmarks/parallel.py table $(ls "$OUT"/*.json) | tee "$OUT/table.txt" ;;
        *) echo "unknown step $name" >&2; return 2 ;;
    esac
}

status=0
for name in "${STEPS[@]}"; do
    start=$(date +%s)
    if [ "$name" = table ]; then step table || status=1; continue; fi
    rm -f "$OUT/$name.json"  # (a step that fails leaves no earlier run's JSON for the table)
    step "$name" > "$OUT/$name.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] || status=1
    echo "$name: exit $rc in $(( $(date +%s) - start )) s (log: $OUT/$name.log)"
    tail -n 5 "$OUT/$name.log"
done
exit $status  # (1 if any step failed; the others still ran)
