# Session 15, call 4 (commit "gated B16 products write the down product's x records ..."; carry .whl and .llb, the
# xz-compressed llama-bench of scripts/build_llamacpp_cuda.sh): mvbc's GPU test (cluster 1 and 2), the backend's
# B16 test (now with LITE_GATED_RECORDS on / off), the A/B of mvbc's forms and cluster sizes and of the gated
# product's records (scripts/session15/mvbc_ab.py), then 8B IQ3_XXS decode: lite (B16 with and without the gated
# records; G4) against llama.cpp on the same file, tg128 after 512 (-r 5).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 570 - ($(date +%s) - T0) )); }
mkdir -p /tmp/llb && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.llb/llama-bench.xz'), open('/tmp/llb/llama-bench', 'wb'))" && chmod +x /tmp/llb/llama-bench
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1 ) &
echo "== mvbc GPU test"; timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_matvec_mma_emulated.py -k "gpu_mvbc" 2>&1 | tail -5
echo "== backend b16 test"; timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py -k "b16" 2>&1 | tail -5
echo "== mvbc_ab ($(left) s left)"; timeout 200 python3 scripts/session15/mvbc_ab.py 2>&1 | tail -40
wait; echo "== synth: $(ls -la /tmp/8i.gguf 2>&1) ($(left) s left)"
for v in "1 1" "1 0" "0 1" "1 1"; do
  [ "$(left)" -gt 130 ] || break
  set -- $v; printf "LITE_IQ3_B16=%s LITE_GATED_RECORDS=%s " $1 $2; LITE_IQ3_B16=$1 LITE_GATED_RECORDS=$2 timeout 100 $L bench /tmp/8i.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | grep -E "pp512|tg128|rror|Error" | tail -3
done
echo "== llama.cpp ($(left) s left)"
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(( $(left) - 5 )) /tmp/llb/llama-bench -m /tmp/8i.gguf -p 512 -n 128 -d 0,512 -fa 1 -ngl 99 -r 5 -o md 2>&1 | tee $OUT/peer.md | grep -E "pp512|tg128|error|model" | tail -6
echo "== done $(( $(date +%s) - T0 )) s"
