# Session 15, call 7 (commit "call7.sh ..."; carry .whl and .llb): IQ3_XXS_B16 as the default on the MoE file too (the
# 30B-A3B's attention products; its experts stay on moe_mvw): tg128 after 2048 (-r 3), B16 / G4 / B16, and
# llama.cpp's tg128 @ d2048 (-r 3) on the same file.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 575 - ($(date +%s) - T0) )); }
mkdir -p /tmp/llb && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.llb/llama-bench.xz'), open('/tmp/llb/llama-bench', 'wb'))" && chmod +x /tmp/llb/llama-bench
$L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS /tmp/30i.gguf > $OUT/synth.log 2>&1; echo "== synth $(ls -la /tmp/30i.gguf) ($(left) s left)"
for b in 1 0 1; do
  [ "$(left)" -gt 150 ] || break
  printf "LITE_IQ3_B16=%s " $b; LITE_IQ3_B16=$b timeout 120 $L bench /tmp/30i.gguf -p 2048 -n 128 -r 3 --device cuda 2>&1 | grep -E "tg128|rror|Error" | tail -2
done
echo "== llama.cpp ($(left) s left)"
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(( $(left) - 5 )) /tmp/llb/llama-bench -m /tmp/30i.gguf -p 0 -n 128 -d 2048 -fa 1 -ngl 99 -r 3 -o md 2>&1 | tee $OUT/peer.md | grep -E "tg128|error" | tail -3
echo "== done $(( $(date +%s) - T0 )) s"
