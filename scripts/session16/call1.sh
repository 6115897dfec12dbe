# Session 16, call 1 (commit ce093de, the hand-off since removed: it measured even): the hand-off's GPU tests (the full-size
# products now through qxa + mvbh, the chain against the PDL wait bit for bit), its A/B at the table's shapes, issue 3's
# table row 5 times with the hand-off the default (median of the 5), then the backend's IQ3 tests.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
T0=$(date +%s)
timeout 150 python3 -m pytest -q -x tests/test_matvec_mma_emulated.py -k "gpu" 2>&1 | tail -4
echo "== A/B ($(( $(date +%s) - T0 )) s)"
timeout 150 python3 scripts/session16/handoff_ab.py 5 2>&1 | tee $OUT/ab.md | tail -8
echo "== table ($(( $(date +%s) - T0 )) s)"
for i in 1 2 3 4 5; do
  timeout 40 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 --json $OUT/kt$i.json > $OUT/kt$i.md 2>&1
done
python3 - <<'PY'
import json, os, statistics
out = os.environ["OUT"]; pcts = []
for i in range(1, 6):
    try:
        rows = json.load(open(f"{out}/kt{i}.json"))
    except Exception as e:  # noqa: BLE001
        print("run", i, "no json:", e); continue
    for r in rows:
        if r["type"] == "IQ3_XXS_B16" and r["kernel"] == "matvec" and r["shape"] == "4096x14336":
            pcts.append(r["pct_copy"]); print(f"run {i}: {r['us']:.2f} us {r['gbps']:.0f} GB/s {r['pct_copy']:.1f}%")
if pcts:
    print(f"median of {len(pcts)}: {statistics.median(pcts):.1f}% (min {min(pcts):.1f}, max {max(pcts):.1f})")
PY
echo "== backend ($(( $(date +%s) - T0 )) s)"
timeout $(( 560 - ($(date +%s) - T0) )) python3 -m pytest -q -x tests/test_cuda_backend.py -k "IQ3 or iq3" 2>&1 | tail -4
echo "== done $(( $(date +%s) - T0 )) s"
