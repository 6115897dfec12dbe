# Session 13, call 11: prefetches without registers in mvb (x of the next block into L1, weights past the ring
# into L2; scripts/session13/mvb_prefetch.py); the GPU test.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 300 python3 scripts/session13/mvb_prefetch.py 2>&1 | tail -24
