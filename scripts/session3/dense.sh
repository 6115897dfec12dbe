#!/usr/bin/env bash
# Session 3, device call 2 (one H200, carry .whl; /tmp/llb/llama-bench copied by the call before):
# (docs/wip/decode-attention-latency.patch, applied by this script, was removed after this run: see
# BENCHMARKS.md, session 3; it is in git history before commit "BENCHMARKS: session 3".)
# llama.cpp peer and lite on the 8B Q4_K file in the same session, then the never-run decode
# variants (half2 matvec, decode-attention patch), end to end. Results under $OUT.
set -u
source scripts/device_setup.sh
L="python3 -m lite.cli.main"; O=${OUT:-/tmp/out}; mkdir -p "$O"
log() { echo "== $(date +%T) $*" | tee -a "$O/dense.log"; }
nvidia-smi -L | tee -a "$O/dense.log"
log synth; ( time $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf ) 2>&1 | tail -3 | tee -a "$O/dense.log"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
log peer; /tmp/llb/llama-bench -m /tmp/8b.gguf -p 512,8192,32768 -n 128 -fa 1 -ngl 99 -ub 512,2048 -r 3 -o md 2>&1 | tee "$O/peer_8b.md" | tail -15
log peer depth; /tmp/llb/llama-bench -m /tmp/8b.gguf -p 0 -n 128 -d 8192,32768 -fa 1 -ngl 99 -ub 2048 -r 3 -o md 2>&1 | tee "$O/peer_8b_depth.md" | tail -6
log lite; $L bench /tmp/8b.gguf -p 512,8192,32768 -n 128 -r 3 --device cuda --prefill auto 2>&1 | tee "$O/lite_8b.txt" | tail -10
log half2 tests; python3 -m pytest -q tests/test_kernels_matvec_half.py 2>&1 | tail -3 | tee -a "$O/dense.log"
log half2 sweep; python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K --variants mvh8,mvh4,mvh8c64,mvh4c64 2>&1 | tail -30 | tee "$O/sweep_half.txt"
log profile base; python3 scripts/profile_decode.py /tmp/8b.gguf 512 2>&1 | tail -16 | tee "$O/profile_base.txt"
for cfg in "Q4_K=mvh,8;Q6_K=mvh,4" "Q4_K=mvh,4;Q6_K=mvh,4" "Q4_K=mvh,8,64;Q6_K=mvh,4"; do
  log "e2e $cfg"; LITE_MATVEC_CONFIG="$cfg" $L bench /tmp/8b.gguf -p 512 -n 128 -r 3 --device cuda 2>&1 | tail -3 | tee -a "$O/e2e_half.txt"
done
log decode-attention patch; patch -p1 < docs/wip/decode-attention-latency.patch && python3 -m pip install -q --no-deps --no-index --no-build-isolation . >/dev/null
python3 -m pytest -q tests/test_cuda_decode.py 2>&1 | tail -3 | tee -a "$O/dense.log"
python3 scripts/bench_decode_attn.py 2>&1 | tail -12 | tee "$O/attn_patch.txt"
$L bench /tmp/8b.gguf -p 512,8192 -n 128 -r 3 --device cuda 2>&1 | tail -4 | tee "$O/lite_8b_patch.txt"
patch -R -p1 < docs/wip/decode-attention-latency.patch && python3 -m pip install -q --no-deps --no-index --no-build-isolation . >/dev/null
log done
