#!/usr/bin/env bash
# Issue 28's cost tables, in one call on a 4-GPU machine (nvidia-h200-x4, carry [".whl"]):
#   source tools/device_setup.sh && bash tools/cost_tables.sh
# Records, with tools/record_cost_tables.py, prefill seconds at 2K/8K/32K prompts for fixed chunks
# 1024..16384 and --prefill auto (median of 3 after a warm-up of the same size before each run) for:
# the 8B Q4_K all-GPU on 1 stage and 2 and 4 virtual stages, the 30B-A3B IQ3_XXS all-GPU and with
# experts in host RAM at --expert-cache 100%, 50%, 25% (one list of settings per GPU, side by side),
# then the tiny llama on the CPU; then checks every table: auto within 3% of the best fixed chunk
# (the check needs no GPU: `python3 tools/record_cost_tables.py --check TABLE...` anywhere).
# Tables land in $OUT/tables (copy them to tests/data/cost_tables/), logs and profiles in $OUT.
# Env: OUT (/tmp/cost-tables), DIR (model files, /tmp), PROMPTS, CHUNKS, REPS (3), DEVICE (cuda;
#      cpu runs the script without a GPU), P8 (8b) and P30 (30b-a3b): presets (tiny for a smoke test).
set -u
out=${OUT:-/tmp/cost-tables}; D=${DIR:-/tmp}; T=$out/tables; mkdir -p "$T" "$D"
export LITE_CACHE=${LITE_CACHE:-$out/lite-cache}
L="python3 -m lite.cli.main"; R="python3 tools/record_cost_tables.py"
PROMPTS=${PROMPTS:-2048,8192,32768}; CHUNKS=${CHUNKS:-1024,2048,4096,8192,16384}; REPS=${REPS:-3}
DEVICE=${DEVICE:-cuda}; P8=${P8:-8b}; P30=${P30:-30b-a3b}
m8=$D/llama-$P8-Q4_K.gguf; m30=$D/qwen3moe-$P30-IQ3_XXS.gguf; tiny=$D/llama-tiny-Q4_K-cpu.gguf
[ -f "$m8" ] || $L synth --arch llama --preset "$P8" --quant Q4_K "$m8" >/dev/null &
[ -f "$m30" ] || $L synth --arch qwen3moe --preset "$P30" --quant IQ3_XXS "$m30" >/dev/null &
[ -f "$tiny" ] || $L synth --arch llama --preset tiny --quant Q4_K "$tiny" >/dev/null &
wait
rec() {   # GPU model table [options]
    local gpu=$1 model=$2 table=$3; shift 3
    echo "== $table $*"
    CUDA_VISIBLE_DEVICES=$gpu $R "$model" "$T/$table.json" --device "$DEVICE" --prompts "$PROMPTS" \
        --chunks "$CHUNKS" --repeats "$REPS" "$@" || echo "   failed: $table"
}
{ rec 0 "$m8" 8b-q4k-gpu-1x1; rec 0 "$m8" 8b-q4k-gpu-1x2 --layer-split 2; } > "$out/gpu0.log" 2>&1 &
{ rec 1 "$m8" 8b-q4k-gpu-1x4 --layer-split 4
  rec 1 "$m30" 30b-iq3xxs-gpu --experts gpu; } > "$out/gpu1.log" 2>&1 &
{ rec 2 "$m30" 30b-iq3xxs-host100 --experts host --expert-cache 100%
  rec 2 "$m30" 30b-iq3xxs-host50 --experts host --expert-cache 50%; } > "$out/gpu2.log" 2>&1 &
rec 3 "$m30" 30b-iq3xxs-host25 --experts host --expert-cache 25% > "$out/gpu3.log" 2>&1 &
wait
# the CPU table last, alone: its BLAS threads would slow the GPU runs' host side
OMP_NUM_THREADS=8 timeout 120 $R "$tiny" "$T/tiny-llama-cpu.json" --device cpu --prompts 256,1024,2048 \
    --chunks 64,128,256,512,1024,2048 --repeats 5 > "$out/cpu.log" 2>&1 || echo "   failed: tiny-llama-cpu"
grep -h "failed\|Error" "$out"/*.log
$R --check "$T"/*.json | tee "$out/check.log"
