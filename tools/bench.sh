#!/usr/bin/env bash
# The GPU benchmarks behind BENCHMARKS.md, on the GPU machine after `source tools/device_setup.sh`:
#   bash tools/bench.sh dense               # the dense rows (8B synthetic file: prefill, decode, stages)
#   bash tools/bench.sh moe                 # the MoE rows (30B-A3B), Q4_K and IQ3_XXS
#   bash tools/bench.sh moe Q4_K            # one quant
#
# dense writes to ${OUT:-/tmp/lite-bench}: tests.log, bench.log, timeline_4stages.json.
#
# moe: the MoE table of BENCHMARKS.md for the Qwen3-30B-A3B shape: prefill at 2K, 8K and 32K tokens and
# decode, with all experts on the GPU and with experts streamed from pinned host RAM through GPU caches
# of 0% (--expert-cache off: two layers of staging, nothing kept), 25% and 50% of the experts.
# It runs the defaults (next-layer prefetch, decode through the graph-captured device-managed expert
# cache, half of a cache for prefill, whole layers streamed past 16 token-slots an expert); compare
# them with `lite bench --config expert_prefetch=off,...` (docs/configuration.md).
# `lite bench --verbose` prints the counters: dev_* (device cache), host_calls/host_syncs/host_s.
# Env: PRESET (30b-a3b; `tiny` for a smoke test), PROMPTS (2048,8192,32768), NGEN (64), REPS (2),
#      CHUNK (prefill chunk, 8192: a chunk's compute hides its layers' copies), DEVICE (cuda; cpu runs the script without a GPU), DIR (where
#      the synthetic files go, /tmp), OUT (JSON rows and the table; default $DIR/moe_bench).
# Writing the 30B-A3B Q4_K file took 20 s on the H200 machine (17.4 GB).
set -u

dense() {
    out=${OUT:-/tmp/lite-bench}; mkdir -p "$out"
    L="python3 -m lite.cli.main"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/bench.log"
    python3 -m pytest -q tests/test_cuda_backend.py 2>&1 | tail -3 | tee "$out/tests.log"
    [ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf 2>&1 | tail -1
    run() { echo "\$ lite $*" | tee -a "$out/bench.log"; $L "$@" 2>&1 | tee -a "$out/bench.log"; }
    run bench /tmp/8b.gguf -p 512,2048,8192 -n 128 -r 3 --device cuda --prefill 2048
    run bench /tmp/8b.gguf -p 32768 -n 32 -r 2 --device cuda --prefill 2048
    run bench /tmp/8b.gguf -p 8192 -n 32 -r 2 --device cuda --prefill 2048 --layer-split 2
    run bench /tmp/8b.gguf -p 8192 -n 32 -r 2 --device cuda --prefill 2048 --layer-split 4 --timeline "$out/timeline_4stages.json"
    run bench /tmp/8b.gguf -p 8192 -n 0 -r 2 --device cuda --prefill 2048 --layer-split 4 --pipeline sync
    run bench /tmp/8b.gguf -p 8192 -n 0 -r 2 --device cuda --prefill auto --layer-split 4
    run bench /tmp/8b.gguf -p 8192 -n 0 -r 2 --device cuda --prefill 1024
    run bench /tmp/8b.gguf -p 8192 -n 128 -r 2 --device cuda --prefill 2048 --kv int8
}

moe() {
    PRESET=${PRESET:-30b-a3b}; PROMPTS=${PROMPTS:-2048,8192,32768}; NGEN=${NGEN:-64}; REPS=${REPS:-2}
    CHUNK=${CHUNK:-8192}; DEVICE=${DEVICE:-cuda}; DIR=${DIR:-/tmp}; out=${OUT:-$DIR/moe_bench}
    mkdir -p "$out" "$DIR"
    L="python3 -m lite.cli.main"
    quants=${*:-Q4_K IQ3_XXS}
    for q in $quants; do
        f="$DIR/qwen3moe-$PRESET-$q.gguf"
        [ -f "$f" ] || $L synth --arch qwen3moe --preset "$PRESET" --quant "$q" "$f" >/dev/null || exit 1
        gib=$(python3 -c "from lite.gguf_file import GGUFFile; g = GGUFFile('$f')
print(sum(t.nbytes for n, t in g.tensors.items() if n.endswith('_exps.weight')) / 2**30)")
        for cfg in "gpu auto" "host off" "host 0.25" "host 0.5"; do
            set -- $cfg
            mode=$1; cache=$2; label=$cache
            case $cache in 0.*) cache=$(python3 -c "print(f'{$gib * $cache:.3f}')"); label="$(python3 -c "print(int($2 * 100))")%";; esac
            [ "$label" = off ] && label="0%"
            echo "== $q experts $mode cache $label ($cache GiB of $gib)" >&2
            $L bench "$f" -p "$PROMPTS" -n "$NGEN" -r "$REPS" --device "$DEVICE" --prefill "$CHUNK" \
                --experts "$mode" --expert-cache "$cache" --verbose --json \
                > "$out/$q-$mode-${label%\%}.json" || echo "   failed" >&2
        done
    done
    python3 - "$out" <<'EOF'
import glob, json, sys
rows = {}
for path in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try:
        data = json.load(open(path))
    except ValueError:
        continue
    key = path.rsplit("/", 1)[-1][:-5]
    rows[key] = data
tests = []
for data in rows.values():
    for r in data:
        if r["test"] not in tests:
            tests.append(r["test"])
head = ["quant-experts-cache%"] + tests + ["hit rate", "GB streamed", "GPU wait s", "dev hit", "host syncs"]
lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
for key, data in rows.items():
    by = {r["test"]: r["tok_s"] for r in data}
    st = data[0].get("experts") or {}
    cells = [key] + [f"{by[t]:.1f}" if t in by else "" for t in tests]
    cells += [str(st.get("hit_rate", "")), f"{st['bytes_streamed'] / 1e9:.2f}" if st else "",
              str(st.get("gpu_wait_s", ""))]
    dh, dm = st.get("dev_hits", 0), st.get("dev_misses", 0)
    cells += [f"{dh / (dh + dm):.3f}" if dh + dm else "", str(st.get("host_syncs", ""))]
    lines.append("| " + " | ".join(cells) + " |")
table = "\n".join(lines)
print(table)
open(sys.argv[1] + "/table.md", "w").write(table + "\n")
EOF
}

case ${1:-} in
    dense) shift; dense "$@" ;;
    moe) shift; moe "$@" ;;
    *) echo "usage: bash tools/bench.sh dense | moe [QUANT...]" >&2; exit 2 ;;
esac
