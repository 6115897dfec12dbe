# Session 14, call 13 -- NOT RUN (refused: the session's device time was spent; `bash scripts/gpu_first_checks.sh
# next` runs the same test file): mvbe (mvb with the decode step's next op: add, silu / gelu_tanh over interleaved
# [gate; up], scale in) on the GPU at full size, and the file's other GPU tests.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 110 python3 -m pytest -q tests/test_matvec_mma_emulated.py -k gpu 2>&1 | tail -4
