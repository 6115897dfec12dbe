# Session 16, call 7 (commit "matvec_mma.config: (8, 1, 1, 1, 1) where the bands fit 2 CTAs an SM ..."; carry .whl and
# .llb): the GPU tests with the new default (the mma file's, the backend's IQ3 ones), issue 3's table row 5 times
# (median), forms_ab --wide (the 4-warp shapes), then 8B IQ3_XXS decode tg128 after 512: lite with the new 8-warp form
# and session 15's (LITE_MVB_PREDECODE=0), alternating, against llama.cpp on the same file.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
mkdir -p /tmp/llb && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.llb/llama-bench.xz'), open('/tmp/llb/llama-bench', 'wb'))" && chmod +x /tmp/llb/llama-bench
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1 ) &
timeout 120 python3 -m pytest -q -x tests/test_matvec_mma_emulated.py -k "gpu" 2>&1 | tail -2
timeout 100 python3 -m pytest -q -x tests/test_cuda_backend.py -k "IQ3 or iq3" 2>&1 | tail -2
echo "== table ($(left) s left)"
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
grep -E "copy-vec16|IQ3_XXS_B16" $OUT/kt1.md | head -12
echo "== forms --wide ($(left) s left)"
PYTHONPATH=/tmp/site:tests timeout 120 python3 scripts/session16/forms_ab.py 3 --wide 2>&1 | tee $OUT/forms_wide.md | tail -12
wait; echo "== synth: $(ls -la /tmp/8i.gguf 2>&1 | awk '{print $5}') ($(left) s left)"
for v in 1 0 1 0; do
  [ "$(left)" -gt 110 ] || break
  printf "LITE_MVB_PREDECODE=%s " $v; LITE_MVB_PREDECODE=$v timeout 90 $L bench /tmp/8i.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | grep -E "tg128|rror|Error" | tail -2
done
echo "== llama.cpp ($(left) s left)"
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(( $(left) - 3 )) /tmp/llb/llama-bench -m /tmp/8i.gguf -p 0 -n 128 -d 512 -fa 1 -ngl 99 -r 5 -o md 2>&1 | tee $OUT/peer.md | grep -E "tg128|error" | tail -2
echo "== done $(( $(date +%s) - T0 )) s"
