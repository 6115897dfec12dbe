# Session 16, call 10 (commit "call 9 output ..."; carry .whl and .llb): 8B IQ3_XXS decode tg128 after 512, mvbe's 8-warp
# form at session 15's (8, 1, 1, 0, 0) (the default) against (8, 1, 1, 1, 1) (LITE_MVBE_PREDECODE=1; call 9: 4096x14336
# 11.64 against 11.89 us, 4096x4096 6.30 against 6.73 in the kernel A/B), alternating 4 times, then llama.cpp.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 400 - ($(date +%s) - T0) )); }
mkdir -p /tmp/llb && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.llb/llama-bench.xz'), open('/tmp/llb/llama-bench', 'wb'))" && chmod +x /tmp/llb/llama-bench
[ -f /tmp/8i.gguf ] || $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1
for v in 0 1 0 1 0 1 0 1; do
  [ "$(left)" -gt 60 ] || break
  printf "LITE_MVBE_PREDECODE=%s " $v
  LITE_MVBE_PREDECODE=$v timeout 60 $L bench /tmp/8i.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | grep -E "tg128|rror|Error" | tail -1
done
echo "== llama.cpp ($(left) s left)"
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(( $(left) - 3 )) /tmp/llb/llama-bench -m /tmp/8i.gguf -p 0 -n 128 -d 512 -fa 1 -ngl 99 -r 5 -o md 2>&1 | tee $OUT/peer.md | grep -E "tg128|error" | tail -2
echo "== done $(( $(date +%s) - T0 )) s"
