# Session 15, call 1 (at the commit "Session 14 note: the read of the whole change"): session 14's work that never ran
# on a GPU: mvbe's full-size test, the backend's opt-in LITE_IQ3_B16=1 (test_cuda_backend -k b16), the kernel
# table's IQ3 rows, an 8B IQ3_XXS decode A/B (LITE_IQ3_B16 0/1, tg128 after 512, -r 3, alternating twice), then
# Nsight Compute on mvb<8,1,1,0> against <8,1,1,1> (scripts/session15/ncu_sg.sh) if time is left.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 560 - ($(date +%s) - T0) )); }
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1 ) &
echo "== mvbe GPU tests"; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_matvec_mma_emulated.py -k gpu 2>&1 | tail -15
echo "== backend b16 tests"; timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "b16" 2>&1 | tail -25
echo "== kernel table ($(left) s left)"; timeout 100 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 2>&1 | tail -12
wait; echo "== synth: $(ls -la /tmp/8i.gguf 2>&1) ($(left) s left)"
for rep in 1 2; do for b in 0 1; do
  [ "$(left)" -gt 60 ] || break 2
  printf "LITE_IQ3_B16=%s " $b; LITE_IQ3_B16=$b timeout 100 $L bench /tmp/8i.gguf -p 512 -n 128 -r 3 --device cuda 2>&1 | grep -E "pp512|tg128|rror|Error" | tail -3
done; done
echo "== ncu ($(left) s left)"; [ "$(left)" -gt 100 ] && timeout $(left) bash scripts/session15/ncu_sg.sh
echo "== done $(( $(date +%s) - T0 )) s"
