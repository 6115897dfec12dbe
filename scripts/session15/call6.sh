# Session 15, call 6 (commit "call6.sh ..."): issue 3's last figure, IQ3_XXS_B16's fused product at 4096x14336 (qxe +
# mvb, the kernel table's row) against copy-vec16, the table run 7 times (each run its own copy bandwidth, each
# figure its own median of 7 graph replays); the median of the 7 percentages last.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
for i in 1 2 3 4 5 6 7; do
  timeout 60 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 --json $OUT/kt$i.json > $OUT/kt$i.md 2>&1
  grep -E "copy-vec16|4096x14336 \| matvec" $OUT/kt$i.md | tr '\n' ' '; echo
done
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]
pcts = []
for i in range(1, 8):
    try:
        rows = json.load(open(f"{out}/kt{i}.json"))
    except Exception as e:  # noqa: BLE001
        print("run", i, "no json:", e); continue
    r = [x for x in rows if x["type"] == "IQ3_XXS_B16" and x["shape"] == "4096x14336" and x["kernel"] == "matvec"][0]
    pcts.append(r["pct_copy"]); print(f"run {i}: {r['us']:.2f} us {r['gbps']:.0f} GB/s {r['pct_copy']:.1f}%")
print(f"median of {len(pcts)}: {statistics.median(pcts):.1f}% (min {min(pcts):.1f}, max {max(pcts):.1f})")
PY
