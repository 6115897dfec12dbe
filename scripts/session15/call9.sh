# Session 15, call 9 -- not run in session 15 (refused: no device time left); session 16 ran it as its call 2 (docs/bench/session16/call2): 8B IQ3_XXS prefill with B16 the default against G4
# at a prompt long enough that the GPU's work outweighs the host's (pp4096, -r 5, alternating twice), and
# llama.cpp's pp4096 (-r 3) on the same file.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 200 - ($(date +%s) - T0) )); }
mkdir -p /tmp/llb && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.llb/llama-bench.xz'), open('/tmp/llb/llama-bench', 'wb'))" && chmod +x /tmp/llb/llama-bench
$L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1
for b in 1 0 1 0; do
  [ "$(left)" -gt 40 ] || break
  printf "LITE_IQ3_B16=%s " $b; LITE_IQ3_B16=$b timeout 60 $L bench /tmp/8i.gguf -p 4096 -n 8 -r 5 --device cuda 2>&1 | grep -E "pp4096|rror|Error" | tail -1
done
echo "== llama.cpp ($(left) s left)"
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(( $(left) - 3 )) /tmp/llb/llama-bench -m /tmp/8i.gguf -p 4096 -n 0 -fa 1 -ngl 99 -ub 2048 -r 3 -o md 2>&1 | tee $OUT/peer.md | grep -E "pp4096|error" | tail -2
echo "== done $(( $(date +%s) - T0 )) s"
