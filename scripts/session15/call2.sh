# Session 15, call 2 (commit "dequant_b16: a warp's record staged in shared memory ..."): IQ3_XXS_B16's dequantize
# staged through shared memory (call 1: LITE_IQ3_B16=1 made 8B pp512 25% slower) at full size on the GPU, against
# session 14's (scripts/session15/dq_ab.py), the kernel table's B16 rows (now with its dequantize), then the 8B
# IQ3_XXS A/B again (LITE_IQ3_B16 0/1, pp512 and tg128 after 512, -r 3, alternating twice).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 560 - ($(date +%s) - T0) )); }
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1 ) &
echo "== dequant GPU test"; timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_matvec_mma_emulated.py -k "gpu_b16_dequantize" 2>&1 | tail -3
echo "== dq_ab"; timeout 120 python3 scripts/session15/dq_ab.py 2>&1 | tail -8
echo "== kernel table ($(left) s left)"; timeout 100 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 2>&1 | tail -10
wait; echo "== synth: $(ls -la /tmp/8i.gguf 2>&1) ($(left) s left)"
for rep in 1 2; do for b in 0 1; do
  [ "$(left)" -gt 60 ] || break 2
  printf "LITE_IQ3_B16=%s " $b; LITE_IQ3_B16=$b timeout 100 $L bench /tmp/8i.gguf -p 512 -n 128 -r 3 --device cuda 2>&1 | grep -E "pp512|tg128|rror|Error" | tail -3
done; done
echo "== done $(( $(date +%s) - T0 )) s"
