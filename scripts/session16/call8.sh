# Session 16, call 8 (commit "matvec_mma.config: mvbe's 8-warp form apart ..."; carry .whl and .llb): mvbe_ab.py (the
# decode's 8-warp mvbe over SG x D), then 8B IQ3_XXS decode tg128 after 512: the default (mvb (8, 1, 1, 1, 1), mvbe
# session 15's (8, 1, 1, 0, 0)), mvbe also (8, 1, 1, 1, 1) (LITE_MVBE_PREDECODE=1), and session 15's everywhere
# (LITE_MVB_PREDECODE=0), alternating, then llama.cpp on the same file.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
L="python3 -m lite.cli.main"; T0=$(date +%s); left() { echo $(( 580 - ($(date +%s) - T0) )); }
mkdir -p /tmp/llb && python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.llb/llama-bench.xz'), open('/tmp/llb/llama-bench', 'wb'))" && chmod +x /tmp/llb/llama-bench
[ -f /tmp/8i.gguf ] || ( $L synth --arch llama --preset 8b --quant IQ3_XXS /tmp/8i.gguf > $OUT/synth.log 2>&1 ) &
PYTHONPATH=/tmp/site:tests timeout 150 python3 scripts/session16/mvbe_ab.py 5 2>&1 | tee $OUT/mvbe.md | tail -11
wait; echo "== decode ($(left) s left)"
for v in "1 0" "1 1" "0 0" "1 0" "1 1" "0 0"; do
  [ "$(left)" -gt 100 ] || break
  set -- $v; printf "LITE_MVB_PREDECODE=%s LITE_MVBE_PREDECODE=%s " $1 $2
  LITE_MVB_PREDECODE=$1 LITE_MVBE_PREDECODE=$2 timeout 80 $L bench /tmp/8i.gguf -p 512 -n 128 -r 5 --device cuda 2>&1 | grep -E "tg128|rror|Error" | tail -2
done
echo "== llama.cpp ($(left) s left)"
LD_LIBRARY_PATH=/usr/local/cuda/lib64 timeout $(( $(left) - 3 )) /tmp/llb/llama-bench -m /tmp/8i.gguf -p 0 -n 128 -d 512 -fa 1 -ngl 99 -r 5 -o md 2>&1 | tee $OUT/peer.md | grep -E "tg128|error" | tail -2
echo "== done $(( $(date +%s) - T0 )) s"
