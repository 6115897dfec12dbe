# Session 13, call 6: x's records a block's words a lane (qxe<.., 18>, mvb<.., XL = 18>: 2 loads of 16 bytes a
# block instead of 8 of 4), with and without the ring (scripts/session13/mvb_ab13.py); the GPU test.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 400 python3 scripts/session13/mvb_ab13.py 2>&1 | tail -32
