#!/usr/bin/env bash
# Issue 39's cost tables on ONE GPU, one regime (or a few) per device call, each call inside the
# tool's 10 minutes (carry [".whl"]):
#   source tools/device_setup.sh && bash tools/cost_tables.sh 8b-1x1 8b-1x2
# Records, with tools/record_cost_tables.py, prefill seconds per prompt length for fixed chunks
# 1024..16384 and --prefill auto (median of 3 after a warm-up of the same size before each run),
# then checks what it wrote: auto within 3% of the best fixed chunk (the check needs no GPU:
# `python3 tools/record_cost_tables.py --check TABLE...` anywhere). Virtual stages share the GPU.
#
# Regimes (name: model, setting, prompts):
#   8b-1x1 8b-1x2 8b-1x4       8B Q4_K all-GPU on 1, 2, 4 virtual stages      2K, 8K, 32K
#   8b-1x1-128k                 8B Q4_K, one stage                             128K
#   30b-gpu                     30B-A3B IQ3_XXS all-GPU                        2K, 8K, 32K
#   30b-gpu-128k                30B-A3B IQ3_XXS all-GPU                        128K
#   30b-host100 30b-host50 30b-host25   experts in host RAM, --expert-cache   2K, 8K, 32K
#   q3n-gpu q3n-host25          qwen3next 80B-A3B IQ3_XXS all-GPU / host 25%   2K, 8K, 32K
#   tiny-cpu                    the tiny llama on the CPU                      256, 1K, 2K
# A call of about 8 minutes holds two 2K-32K regimes of the 8B or one of the MoE files; a 128K
# regime takes a call of its own. Model files are written once per machine (synth skips existing
# files), so later regimes of a warm machine start at once.
# Tables land in $OUT/tables (copy them to tests/data/cost_tables/), logs in $OUT.
# Env: OUT (/tmp/cost-tables), DIR (model files, /tmp), CHUNKS, REPS (3), PROMPTS (overrides the
#      regime's), DEVICE (cuda; cpu runs the script without a GPU), P8, P30, PQ3N: presets (tiny for
#      a smoke test: `DEVICE=cpu P8=tiny PROMPTS=256,512 CHUNKS=128,256 bash tools/cost_tables.sh 8b-1x2`).
set -u
[ $# -gt 0 ] || { sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//' | head -n -1; exit 2; }
out=${OUT:-/tmp/cost-tables}; D=${DIR:-/tmp}; T=$out/tables; mkdir -p "$T" "$D"
export LITE_CACHE=${LITE_CACHE:-$out/lite-cache}
L="python3 -m lite.cli.main"; R="python3 $(dirname "$0")/record_cost_tables.py"
CHUNKS=${CHUNKS:-1024,2048,4096,8192,16384}; REPS=${REPS:-3}; DEVICE=${DEVICE:-cuda}
P8=${P8:-8b}; P30=${P30:-30b-a3b}; PQ3N=${PQ3N:-80b-a3b}
STD=2048,8192,32768; LONG=131072

model() {   # arch preset quant -> the file, written once per machine
    local f=$D/$1-$2-$3.gguf
    [ -f "$f" ] || $L synth --arch "$1" --preset "$2" --quant "$3" "$f" >/dev/null || return 1
    echo "$f"
}

rec() {   # table model prompts [options]
    local table=$1 m=$2 prompts=${PROMPTS:-$3}; shift 3
    echo "== $table prompts $prompts $*"
    $R "$m" "$T/$table.json" --device "$DEVICE" --prompts "$prompts" --chunks "$CHUNKS" \
        --repeats "$REPS" "$@" > "$out/$table.log" 2>&1 || { echo "   failed: $table"; tail -3 "$out/$table.log"; }
}

for regime in "$@"; do
    case $regime in
        8b-1x1)       rec 8b-q4k-gpu-1x1 "$(model llama "$P8" Q4_K)" $STD ;;
        8b-1x2)       rec 8b-q4k-gpu-1x2 "$(model llama "$P8" Q4_K)" $STD --layer-split 2 ;;
        8b-1x4)       rec 8b-q4k-gpu-1x4 "$(model llama "$P8" Q4_K)" $STD --layer-split 4 ;;
        8b-1x1-128k)  rec 8b-q4k-gpu-1x1-128k "$(model llama "$P8" Q4_K)" $LONG ;;
        30b-gpu)      rec 30b-iq3xxs-gpu "$(model qwen3moe "$P30" IQ3_XXS)" $STD --experts gpu ;;
        30b-gpu-128k) rec 30b-iq3xxs-gpu-128k "$(model qwen3moe "$P30" IQ3_XXS)" $LONG --experts gpu ;;
        30b-host*)    rec "30b-iq3xxs-${regime#30b-}" "$(model qwen3moe "$P30" IQ3_XXS)" $STD \
                          --experts host --expert-cache "${regime#30b-host}%" ;;
        q3n-gpu)      rec q3n-iq3xxs-gpu "$(model qwen3next "$PQ3N" IQ3_XXS)" $STD --experts gpu ;;
        q3n-host25)   rec q3n-iq3xxs-host25 "$(model qwen3next "$PQ3N" IQ3_XXS)" $STD \
                          --experts host --expert-cache 25% ;;
        tiny-cpu)     # alone: its BLAS threads would slow a GPU run's host side
                      OMP_NUM_THREADS=8 DEVICE=cpu CHUNKS=64,128,256,512,1024,2048 REPS=5 \
                          rec tiny-llama-cpu "$(model llama tiny Q4_K)" 256,1024,2048 ;;
        *) echo "cost_tables.sh: unknown regime $regime (run it without arguments for the list)" >&2; exit 2 ;;
    esac
done
ls "$T"/*.json >/dev/null 2>&1 && $R --check "$T"/*.json | tee "$out/check.log"
