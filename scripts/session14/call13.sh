# Session 14, call 13 (NOT RUN: the session's device time was spent; gpu_first_checks.sh next runs the same test file): mvbe
# scale in) on the GPU at full size, and the file's other GPU tests.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 110 python3 -m pytest -q tests/test_matvec_mma_emulated.py -k gpu 2>&1 | tail -4
