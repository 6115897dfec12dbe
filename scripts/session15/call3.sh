# Session 15, call 3 (commit "mvbc: x quantized inside the product by clusters of 8 CTAs ..."): mvbc's GPU test (bit
# for bit against qxe + mvb / mvbe), its A/B (scripts/session15/mvbc_ab.py), the backend's IQ3 tests with B16 the
# default, then 8B IQ3_XXS pp2048 / tg128 A/B (LITE_IQ3_B16 0/1, -r 5, alternating twice).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1 ) &
echo "== mma GPU tests"; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_matvec_mma_emulated.py -k gpu 2>&1 | tail -15
echo "== mvbc_ab ($(left) s left)"; timeout 150 python3 scripts/session15/mvbc_ab.py 2>&1 | tail -30
echo "== backend IQ3 tests ($(left) s left)"; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "iq3 or IQ3 or b16" 2>&1 | tail -15
wait; echo "== synth: $(ls -la /tmp/8i.gguf 2>&1) ($(left) s left)"
for rep in 1 2; do for b in 0 1; do
  [ "$(left)" -gt 70 ] || break 2
  printf "LITE_IQ3_B16=%s " $b; LITE_IQ3_B16=$b timeout 100 $L bench /tmp/8i.gguf -p 2048 -n 128 -r 5 --device cuda 2>&1 | grep -E "pp2048|tg128|rror|Error" | tail -3
done; done
echo "== done $(( $(date +%s) - T0 )) s"
