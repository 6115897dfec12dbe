# Session 15, call 8 (commit "mvbp: the gated product 2 bands a CTA writes the down product's x records ..."): mvbp's
# GPU test and the other mvb/mvbe full-size tests, the backend's B16 test (LITE_GATED_RECORDS on / off), the FFN
# pair's A/B (scripts/session15/gated_ab.py), then 8B IQ3_XXS decode LITE_GATED_RECORDS 1/0 alternating (-r 5).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1 ) &
echo "== mma GPU tests"; timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_matvec_mma_emulated.py -k "gpu_mvbp or gpu_mvbe or gpu_mvb_full" 2>&1 | tail -5
echo "== backend b16 test ($(left) s left)"; timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "b16" 2>&1 | tail -5
echo "== gated_ab ($(left) s left)"; timeout 100 python3 scripts/session15/gated_ab.py 2>&1 | tail -6
wait; echo "== synth: $(ls -la /tmp/8i.gguf 2>&1) ($(left) s left)"
for gr in 1 0 1 0; do
  [ "$(left)" -gt 60 ] || break
  printf "LITE_GATED_RECORDS=%s " $gr; LITE_GATED_RECORDS=$gr timeout 100 $L bench /tmp/8i.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | grep -E "tg128|rror|Error" | tail -2
done
echo "== done $(( $(date +%s) - T0 )) s"
