# Session 15, call 5 (commit "Remove mvbc ..."; carry .whl and .llb): with IQ3_XXS_B16 the backend's default, the
# GPU backend's tests, the kernel table for the types, then 8B IQ3_XXS decode (tg128 after 512, -r 5):
# lite B16 three times, G4 once, llama.cpp (tg128 @ d512, -r 5) on the same file.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 575 - ($(date +%s) - T0) )); }
mkdir -p /tmp/llb && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.llb/llama-bench.xz'), open('/tmp/llb/llama-bench', 'wb'))" && chmod +x /tmp/llb/llama-bench
( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1 ) &
echo "== kernel table"; timeout 150 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 Q4_K Q6_K Q8_0 2>&1 | tee $OUT/ktable.md | grep -E "copy|4096x14336"
wait; echo "== synth: $(ls -la /tmp/8i.gguf 2>&1) ($(left) s left)"
for b in 1 0 1 1; do
  printf "LITE_IQ3_B16=%s " $b; LITE_IQ3_B16=$b timeout 100 $L bench /tmp/8i.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | grep -E "tg128|rror|Error" | tail -2
done
echo "== llama.cpp ($(left) s left)"
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout 120 /tmp/llb/llama-bench -m /tmp/8i.gguf -p 0 -n 128 -d 512 -fa 1 -ngl 99 -r 5 -o md 2>&1 | tee $OUT/peer.md | grep -E "tg128|error" | tail -3
echo "== GPU backend tests ($(left) s left)"
timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py 2>&1 | tail -6
echo "== done $(( $(date +%s) - T0 )) s"
