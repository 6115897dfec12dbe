#!/usr/bin/env bash
# MoE decode with the two grouped matvec kernels, one command (issue 6): moe_mv (LITE_MOE_MV=cta,
# the default) against moe_mvw (LITE_MOE_MV=warp, kernels/moe_mvw.py, NOT yet run on a GPU), on the
# synthetic Qwen3-30B-A3B with all experts on the GPU (decode graph-captured).
# On the GPU machine, after `source scripts/device_setup.sh`:
#   bash scripts/moe_decode_ab.sh              # Q4_K
#   bash scripts/moe_decode_ab.sh IQ3_XXS      # one other quant (moe_mvw takes every moe_mv type)
# First the GPU tests of the variant (moe_mvw = moe_mv within fp32 rounding, a layer = the CPU
# backend); the timing does not run when they fail (FORCE=1 runs it anyway). Then one `lite bench`
# process a variant (separate processes: captured decode graphs keep the kernel they were built with).
# MVW_EXTRA: more moe_mvw shapes to time, space-separated LITE_MOE_MVW values (kernels/moe_mvw.py),
#   e.g. MVW_EXTRA="2048=16,2,4 2048=32,2,2;768=16,2,2" (rows "warp 2048=16,2,4", ...).
# Env: PRESET (30b-a3b; `tiny` for a smoke test), PROMPTS (2048,8192), NGEN (32), REPS (3),
#      DEVICE (cuda; cpu smoke-tests the script, where the switch changes nothing), DIR (/tmp, where
#      the synthetic file goes), OUT ($DIR/moe_decode_ab).
set -u
q=${1:-Q4_K}; PRESET=${PRESET:-30b-a3b}; PROMPTS=${PROMPTS:-2048,8192}; NGEN=${NGEN:-32}; REPS=${REPS:-3}
DEVICE=${DEVICE:-cuda}; DIR=${DIR:-/tmp}; out=${OUT:-$DIR/moe_decode_ab}
mkdir -p "$out"
L="python3 -m lite.cli.main"
if ! python3 -m pytest -q -x tests/test_experts_mvw.py; then
    echo "moe_mvw GPU tests failed" >&2
    [ "${FORCE:-0}" = 1 ] || exit 1
fi
f="$DIR/qwen3moe-$PRESET-$q.gguf"
[ -f "$f" ] || $L synth --arch qwen3moe --preset "$PRESET" --quant "$q" "$f" >/dev/null || exit 1
run() {   # label, LITE_MOE_MV, LITE_MOE_MVW
    echo "== $q $1" >&2
    LITE_MOE_MV=$2 LITE_MOE_MVW=$3 $L bench "$f" -p "$PROMPTS" -n "$NGEN" -r "$REPS" --device "$DEVICE" \
        --experts gpu --json > "$out/$q-$1.json" || echo "   failed" >&2
}
run cta cta ""
run warp warp ""
labels="cta warp"
for x in ${MVW_EXTRA:-}; do
    run "warp-$x" warp "$x"; labels="$labels warp-$x"
done
python3 - "$out" "$q" $labels <<'PY'
import json, sys
d, q, labels = sys.argv[1], sys.argv[2], sys.argv[3:]
res = {}
for v in labels:
    try:
        res[v] = {r["test"]: r["tok_s"] for r in json.load(open(f"{d}/{q}-{v}.json"))}
    except (OSError, ValueError):
        res[v] = {}
tests = sorted({t for r in res.values() for t in r if t.startswith("tg")}, key=lambda t: int(t.split("@")[1]))
lines = [f"| {q} kernel (LITE_MOE_MV / LITE_MOE_MVW) | " + " | ".join(f"{t} tok/s" for t in tests)
         + " | vs cta |", "|---|" + "---|" * (len(tests) + 1)]
for v in labels:
    cells = [f"{res[v][t]:.1f}" if t in res[v] else "" for t in tests]
    base = [res["cta"].get(t) and res[v].get(t) and res[v][t] / res["cta"][t] for t in tests]
    lines.append(f"| {v} | " + " | ".join(cells) + " | " + " / ".join(f"{b:.3f}" for b in base if b) + " |")
table = "\n".join(lines)
print(table)
open(f"{d}/{q}-table.md", "w").write(table + "\n")
PY
