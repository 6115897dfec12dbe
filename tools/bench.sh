#!/usr/bin/env bash
# The GPU benchmarks behind BENCHMARKS.md, on the GPU machine after `source tools/device_setup.sh`:
#   bash tools/bench.sh dense               # the dense rows (8B synthetic file: prefill, decode, stages)
#   bash tools/bench.sh moe                 # the MoE rows (30B-A3B), Q4_K and IQ3_XXS
#   bash tools/bench.sh moe Q4_K            # one quant
#   bash tools/bench.sh qwen3next           # issue 42's table: qwen3next 80B-A3B IQ3_XXS against llama.cpp
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
#
# qwen3next (meant to fit one device call): tests/test_qwen3next_gpu.py (one line; the
# synthetic file is written meanwhile, once), then `lite bench` (median of REPS): decode tg NGEN after
# PROMPT with --config hybrid_graphs=off and =on, prefill PROMPT and LONG, experts in host RAM with a
# 25% cache (prefill LONG, decode); tools/profile_decode.py on the graphed decode, with its per-kernel
# table when ncu is there; llama-bench on the same file when LLAMA_BENCH names one (all layers on the
# GPU, then `-ncmoe NCMOE -b 8192 -ub 8192`, as llama.cpp's ubatch is capped by its batch); last, the
# table lite against llama.cpp. Env: PRESET (80b-a3b; tiny: a CPU smoke test, short prompts), QUANT
# (IQ3_XXS), PROMPT (2048), LONG (8192), NGEN (64), REPS (3), CHUNK (--prefill, 8192), CONFIG (more
# --config settings for every run), DEVICE (cuda; cpu skips the GPU-only steps with a line), DIR (/tmp),
# OUT (logs, JSON rows, kernels.md, table.md; default $DIR/qwen3next_bench), LLAMA_BENCH (the
# binary), LLAMA_WAIT (seconds to wait for it to appear, while it builds in the background; 0), NCMOE
# (48), STEPS (`tests decode prefill host profile llama`: a subset splits the work over calls; each call's table
# holds what it measured).
set -u

dense() {
    out=${OUT:-/tmp/lite-bench}; mkdir -p "$out"
    L="python3 -m lite.cli.main"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/bench.log"
    python3 -m pytest -q tests/test_cuda_backend.py tests/test_cuda_decode_attention.py 2>&1 | tail -3 | tee "$out/tests.log"
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
        gib=$(python3 -c "from lite.files.gguf_file import GGUFFile; g = GGUFFile('$f')
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

qwen3next() {
    PRESET=${PRESET:-80b-a3b}; QUANT=${QUANT:-IQ3_XXS}; DEVICE=${DEVICE:-cuda}; DIR=${DIR:-/tmp}
    REPS=${REPS:-3}; CHUNK=${CHUNK:-8192}; CONFIG=${CONFIG:-}; NCMOE=${NCMOE:-48}
    if [ "$PRESET" = tiny ]; then PROMPT=${PROMPT:-64}; LONG=${LONG:-256}; NGEN=${NGEN:-16}
    else PROMPT=${PROMPT:-2048}; LONG=${LONG:-8192}; NGEN=${NGEN:-64}; fi
    out=${OUT:-$DIR/qwen3next_bench}; mkdir -p "$out" "$DIR"; : > "$out/commands.txt"
    L="python3 -m lite.cli.main"
    f="$DIR/qwen3next-$PRESET-$QUANT.gguf"
    gpu=""; [ "$DEVICE" = cuda ] && gpu=1
    STEPS=${STEPS:-tests decode prefill host profile llama}
    want() { case " $STEPS " in *" $1 "*) ;; *) echo "== $1: skipped (not in STEPS)"; return 1 ;; esac; }
    [ -n "$gpu" ] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    synth=""
    if [ ! -f "$f" ]; then       # written while the tests run: they need the GPU, the writer CPU and disk
        $L synth --arch qwen3next --preset "$PRESET" --quant "$QUANT" "$f" > "$out/synth.log" 2>&1 &
        synth=$!
    fi
    if ! want tests; then
        :
    elif [ -n "$gpu" ]; then
        python3 -m pytest -q -p no:cacheprovider tests/test_qwen3next_gpu.py > "$out/tests.log" 2>&1
        echo "== tests/test_qwen3next_gpu.py: $(tail -1 "$out/tests.log")"
    else
        echo "== tests/test_qwen3next_gpu.py: skipped (DEVICE=$DEVICE: GPU tests)"
    fi
    if [ -n "$synth" ]; then
        wait "$synth" || { echo "== lite synth failed: $(tail -1 "$out/synth.log")"; return 1; }
        echo "== $(tail -1 "$out/synth.log")"
    else
        echo "== $f: present, not written again"
    fi

    lb() {      # lb NAME ARGS..: one `lite bench` run, its JSON rows in $out/NAME.json
        local name=$1; shift
        local cmd="lite bench $f $* --device $DEVICE --prefill $CHUNK -r $REPS"
        echo "== $cmd" | tee -a "$out/commands.txt"
        if $L bench "$f" "$@" --device "$DEVICE" --prefill "$CHUNK" -r "$REPS" --json \
                > "$out/$name.json" 2> "$out/$name.log"; then
            python3 -c "import json, sys
for r in json.load(open(sys.argv[1])): print(f\"   {r['test']:>14s} {r['tok_s']:10.1f} tok/s\")" "$out/$name.json"
            grep '^experts:' "$out/$name.log" | sed 's/^/   /'
        else
            echo "   failed: $(tail -1 "$out/$name.log")"; rm -f "$out/$name.json"
        fi
    }
    cfg=${CONFIG:+--config $CONFIG}; hyb=${CONFIG:+$CONFIG,}hybrid_graphs
    want decode && {
    lb decode-off -p "$PROMPT" -n "$NGEN" --experts gpu --config "$hyb=off"
    lb decode-on -p "$PROMPT" -n "$NGEN" --experts gpu --config "$hyb=on"
    }
    want prefill && lb prefill -p "$PROMPT,$LONG" -n 0 --experts gpu $cfg
    want host && lb host -p "$LONG" -n "$NGEN" --experts host --expert-cache 25% --verbose $cfg

    hyb=$hyb=on
    if ! want profile; then
        :
    elif [ -z "$gpu" ]; then
        echo "== tools/profile_decode.py: skipped (DEVICE=$DEVICE: GPU only)"
    else
        echo "== python3 tools/profile_decode.py $f $PROMPT $hyb" | tee -a "$out/commands.txt"
        python3 tools/profile_decode.py "$f" "$PROMPT" "$hyb" > "$out/profile.log" 2>&1
        sed 's/^/   /' "$out/profile.log" | tail -30
        replay=$(sed -n 's/.*GPU time per replay \([0-9.]*\) ms.*/\1/p' "$out/profile.log" | head -1)
        ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
        if [ -z "$ncu" ]; then
            echo "   no ncu on this machine: no per-kernel table"
        else             # each kernel node of one replayed step, timed alone (tools/profile_decode.py)
            timeout 240 "$ncu" --profile-from-start off --graph-profiling node --clock-control none \
                --metrics gpu__time_duration.sum --csv python3 tools/profile_decode.py --trace "$f" \
                "$PROMPT" 1 "$hyb" > "$out/kernels.csv" 2> "$out/ncu.log"
            if python3 tools/profile_decode.py --summary "$out/kernels.csv" 1 \
                    ${replay:+$(python3 -c "print($replay * 1e3)")} > "$out/kernels.md" 2>&1; then
                echo "== per-kernel GPU time of one graphed decode step (ncu)"; cat "$out/kernels.md"
            else
                echo "   no per-kernel table: $(tail -1 "$out/ncu.log")"
            fi
        fi
    fi

    lbin=${LLAMA_BENCH:-}
    if [ -n "$lbin" ] && [ "${LLAMA_WAIT:-0}" -gt 0 ]; then     # still building in the background
        for _ in $(seq "$LLAMA_WAIT"); do [ -x "$lbin" ] && break; sleep 1; done
        sleep 2                                                 # (the linker's last write)
    fi
    llb() {     # llb NAME ARGS..: one llama-bench run, its JSON rows in $out/llama-NAME.json
        local name=$1; shift
        echo "== llama-bench -m $f $*" | tee -a "$out/commands.txt"
        if "$lbin" -m "$f" "$@" -o json > "$out/llama-$name.json" 2> "$out/llama-$name.log"; then
            python3 -c "import json, sys
from statistics import median
for r in json.load(open(sys.argv[1])):
    print(f\"   pp{r['n_prompt']} tg{r['n_gen']} {median(r.get('samples_ts') or [r['avg_ts']]):10.1f} tok/s\")" \
                "$out/llama-$name.json"
        else
            echo "   failed: $(tail -1 "$out/llama-$name.log")"; rm -f "$out/llama-$name.json"
        fi
    }
    if ! want llama; then
        :
    elif [ -z "$lbin" ]; then
        echo "== llama-bench: skipped (no LLAMA_BENCH=/path/to/llama-bench given)"
    elif [ ! -x "$lbin" ]; then
        echo "== llama-bench: skipped ($lbin is not there)"
    else
        llb gpu -p "$PROMPT,$LONG" -n "$NGEN" -fa 1 -ngl 99 -ub 2048 -r "$REPS"
        llb host -p "$LONG" -n "$NGEN" -fa 1 -ngl 99 -ncmoe "$NCMOE" -b 8192 -ub 8192 -r "$REPS"
    fi
    python3 - "$out" "$PROMPT" "$LONG" "$NGEN" "$NCMOE" <<'PY'
import json, statistics, sys
out, prompt, long_, ngen, ncmoe = sys.argv[1:]
def rows(name):
    try:
        return json.load(open(f"{out}/{name}.json"))
    except (OSError, ValueError):
        return []
def lite(name, test):
    return next((r["tok_s"] for r in rows(name) if r["test"] == test), None)
def llama(name, n_prompt, n_gen):    # the median of llama-bench's samples (its avg_ts where none)
    for r in rows("llama-" + name):
        if (r.get("n_prompt"), r.get("n_gen")) == (int(n_prompt), int(n_gen)):
            return statistics.median(r["samples_ts"]) if r.get("samples_ts") else r["avg_ts"]
tg = f"tg{ngen}"
gpu_long = lite("prefill", f"pp{long_}")
host_long = lite("host", f"pp{long_}")
table = [
    (f"decode, {tg} after {prompt}, hybrid_graphs=off", lite("decode-off", f"{tg} @ {prompt}"), llama("gpu", 0, ngen), ""),
    (f"decode, {tg} after {prompt}, hybrid_graphs=on", lite("decode-on", f"{tg} @ {prompt}"), llama("gpu", 0, ngen), ""),
    (f"prefill {prompt}", lite("prefill", f"pp{prompt}"), llama("gpu", prompt, 0), ""),
    (f"prefill {long_}", gpu_long, llama("gpu", long_, 0), ""),
    (f"experts in host RAM (lite --expert-cache 25%, llama.cpp -ncmoe {ncmoe} -b 8192 -ub 8192): prefill {long_}",
     host_long, llama("host", long_, 0),
     f" ({host_long / gpu_long:.0%} of all-GPU)" if host_long and gpu_long else ""),
    (f"same, decode (lite {tg} after {long_})", lite("host", f"{tg} @ {long_}"), llama("host", 0, ngen), ""),
]
num = lambda v: f"{v:,.1f}" if v else "-"
lines = ["| test | lite | llama.cpp | lite / llama.cpp |", "| --- | ---: | ---: | ---: |"]
for name, a, b, note in table:
    lines.append(f"| {name} | {num(a)}{note} | {num(b)} | {f'{a / b:.2f}x' if a and b else '-'} |")
on, off = table[1][1], table[0][1]
lines.append(f"\nhybrid_graphs on / off, decode: {f'{on / off:.2f}x' if on and off else '-'}; tok/s, "
             f"median of the repetitions; llama.cpp's {tg} is llama-bench's (from an empty context)")
st = (rows("host") or [{}])[0].get("experts")
if st:
    lines.append("host experts: " + ", ".join(f"{k} {v}" for k, v in st.items()))
text = "\n".join(lines)
open(f"{out}/table.md", "w").write(text + "\n\n" + open(f"{out}/commands.txt").read())
print(text)
PY
}

case ${1:-} in
    dense) shift; dense "$@" ;;
    moe) shift; moe "$@" ;;
    qwen3next) shift; qwen3next "$@" ;;
    *) echo "usage: bash tools/bench.sh dense | moe [QUANT...] | qwen3next" >&2; exit 2 ;;
esac
