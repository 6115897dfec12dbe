# Session 13, call 5: x's words in the ring with the weights (mvb<.., XR = 1>) against the block's own loads
# and session 12's text (scripts/session13/mvb_ab13.py); the GPU test.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 120 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 400 python3 scripts/session13/mvb_ab13.py 2>&1 | tail -30
