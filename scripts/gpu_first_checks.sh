#!/usr/bin/env bash
# GPU checks by step (on the device, after `source scripts/device_setup.sh`, carry .whl). Results in
# ${OUT:-/tmp/lite-checks}. Session 5 ran gemma, real, pdl, iq3 and ncu with its code, session 6
# matvec, iq3moe and multigpu's tests, session 7 session 6's next, session 8 session 7's, session 9 session 8's
# (figures in BENCHMARKS; the calls: scripts/session*/call*.sh); session 10 left session 9's next for later;
# session 11 ran session 10's, session 12 session 11's, session 13 session 12's, session 14 session 13's, session 15
# session 14's (scripts/session15/call1.sh).
# Re-run a step after changing what it covers.
#   bash scripts/gpu_first_checks.sh next            # first next session (issue 3), ~2 min
#   bash scripts/gpu_first_checks.sh multigpu        # on nvidia-h200-x2
# Steps: gemma, real (needs the real models carried first), pdl, iq3, ncu, matvec, iq3moe, next, multigpu (2 GPUs).
set -u
out=${OUT:-/tmp/lite-checks}; mkdir -p "$out"
L="python3 -m lite.cli.main"
t() { echo "\$ $*" | tee -a "$out/checks.log"; "$@" 2>&1 | tail -${TAIL:-6} | tee -a "$out/checks.log"; }
need_8b() { [ -f /tmp/8b.gguf ] || $L synth --arch llama --preset 8b --quant Q4_K /tmp/8b.gguf >/dev/null 2>&1; }
need_30b() { [ -f /tmp/30b.gguf ] || $L synth --arch qwen3moe --preset 30b-a3b --quant Q4_K /tmp/30b.gguf >/dev/null 2>&1; }

# The synthetic gemma3 file (lite synth --arch gemma3, new in session 4) on the GPU: head dim 256,
# GELU over interleaved gate/up rows, sliding windows; then decode attention v2 at head dim 256
# (emulator-only so far): if both pass, raise kernels/cupy_decode.py's V2_DEFAULT_MAX_D to 256.
step_gemma() {
  t python3 -m pytest -q tests/test_cuda_backend.py -k "gemma3"
  t python3 -m pytest -q tests/test_cuda_decode.py -k "gemma3-256"
  t env LITE_DECODE_ATTN=v2 python3 -m pytest -q tests/test_cuda_backend.py -k "gemma3"
}

# The real models with today's decode path (graph I/O, norm split, gate/up interleaved, v2
# attention): issue 4's last acceptance item. They travel in pieces (scripts/carry_model.sh: one
# `run` per piece, back to back, into ~/.cache/lite/models/ on the device; check the sha256 of
# lite/hub.py). Then v2 attention at Gemma 3's head dim 256 (emulator-only so far): if it passes,
# raise kernels/cupy_decode.py's V2_DEFAULT_MAX_D to 256.
step_real() {
  t python3 -m pytest -q tests/test_cuda_backend.py -k "real"
  t env LITE_DECODE_ATTN=v2 python3 -m pytest -q tests/test_cuda_backend.py -k "real"
  TAIL=12 t python3 scripts/kv_agreement.py smollm2 --device cuda -n 256
}

# LITE_PDL=1 (kernels/pdl.py, never run on a GPU): programmatic dependent launch of the decode
# kernels (matvecs, attention, MoE). The test first (a launch error or wrong logits there means:
# leave it off), then A/B on the 8B file (361.5 tok/s after 512 in session 4) and the 30B-A3B
# file, and the graph replay time (profile_decode's first line; its per-op times replay each op
# alone, which PDL cannot speed up).
step_pdl() {
  t python3 -m pytest -q tests/test_cuda_backend.py -k "programmatic"
  need_8b
  for f in 0 1 0 1; do TAIL=2 t env LITE_PDL=$f $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda; done
  TAIL=4 t env LITE_PDL=1 python3 scripts/profile_decode.py /tmp/8b.gguf 512
  need_30b
  for f in 0 1 0 1; do TAIL=2 t env LITE_PDL=$f $L bench /tmp/30b.gguf -p 2048 -n 128 -r 3 --device cuda; done
}

# The IQ3_XXS matvec after session 3's refactor (iq3xxs_dot32 shared by the dense and the struct
# kernels: same SASS counts, scheduled differently) at full size, and its bandwidth.
# (Also open, no script: a per-shape CTA shape for the register matvec: call 1 of session 4 found
# 16 rows a CTA faster for Q4_K at 6144x4096, 8.4 against 9.7 us, slower at 4096x14336.)
step_iq3() {
  t python3 -m pytest -q tests/test_kernels_matvec.py -k "IQ3"
  TAIL=12 t python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvp8
}

# What binds the matvec kernels (issue 3): Nsight Compute (ncu is on the device image) on Q4_K,
# Q6_K and IQ3_XXS at the decode step's shapes: DRAM throughput, occupancy, warp stall reasons.
step_ncu() {
  TAIL=100 t bash scripts/ncu_matvec.sh
}

# Q4_K's two-instruction dot (mvf, the default since session 6) against the three-instruction one
# (LITE_MATVEC_CONFIG=Q4_K=mv): the sweep (the plain mv kernel), the GPU test, 8B and 30B decode A/Bs.
step_matvec() {
  TAIL=40 t python3 tests/gpu_sweep_matvec.py --types Q4_K --variants mvf80 \
      --shapes 6144x4096,28672x4096,4096x4096,4096x14336
  t python3 -m pytest -q tests/test_cuda_backend.py -k "both_q4k"
  need_8b
  for c in "" "Q4_K=mv" "" "Q4_K=mv"; do
    echo "LITE_MATVEC_CONFIG=$c" | tee -a "$out/checks.log"
    TAIL=1 t env LITE_MATVEC_CONFIG="$c" $L bench /tmp/8b.gguf -p 512 -n 128 -r 5 --device cuda
  done
}

# MoE decode's moe_mvw shapes (LITE_MOE_MVW) and the IQ3 grid's shared copies (LITE_IQ3_GCOPIES;
# default 0 since session 6: read through L1), tg128 after 2K on the IQ3_XXS 30B-A3B file.
step_iq3moe() {
  t python3 -m pytest -q tests/test_cuda_backend.py -k "grid_copies or gated"
  local f=/tmp/30i.gguf
  [ -f $f ] || $L synth --arch qwen3moe --preset 30b-a3b --quant IQ3_XXS $f >/dev/null 2>&1
  for m in "" "2048=16,4,2" "2048=16,1,4" ""; do
    for gc in 0 8; do
      echo "LITE_MOE_MVW=$m LITE_IQ3_GCOPIES=$gc" | tee -a "$out/checks.log"
      TAIL=1 t env LITE_MOE_MVW="$m" LITE_IQ3_GCOPIES=$gc $L bench $f -p 2048 -n 128 -r 3 --device cuda
    done
  done
}

# Session 14's `next` ran as session 15's call 1 (scripts/session15/call1.sh: every check passed); session 15's
# call9.sh ran as session 16's call 2. Next (~2 min): the baseline before changing IQ3_XXS_B16 again (session 16's
# defaults: mvb<8, 1, 1, 1, 1>): its GPU tests, the kernel table's B16 rows, the backend's tests; the forms' A/B is
# scripts/session16/forms_ab.py (PYTHONPATH=/tmp/site:tests).
step_next() {
  t python3 -m pytest -q tests/test_matvec_mma_emulated.py
  TAIL=12 t timeout 200 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4
  t python3 -m pytest -q tests/test_cuda_backend.py -k "b16 or iq3 or IQ3"
}

# Two GPUs (nvidia-h200-x2): the stage's KV cache / experts on its own GPU (fixed in session 2,
# never re-run), the p2p hand-off and --handoff-stream (never run on a GPU).
step_multigpu() {
  need_8b
  t python3 -m pytest -q tests/test_multi_gpu.py
  [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "multigpu: one GPU here" | tee -a "$out/checks.log"; return; }
  TAIL=40 t bash scripts/multi_gpu.sh
  for h in "host" "p2p" "p2p --handoff-stream"; do
    TAIL=8 t $L bench /tmp/8b.gguf -r 2 --device cuda -p 32768 -n 32 --prefill 2048 --devices 0,1 --handoff $h
  done
}

for s in ${*:-gemma real pdl iq3 ncu matvec iq3moe next multigpu}; do
  echo "== $(date +%T) step $s" | tee -a "$out/checks.log"
  "step_$s"
done
