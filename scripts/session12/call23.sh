# Session 12, call 23: mvbq (x quantized by mvb's own CTAs, a grid barrier; launch(fused=True)) against
# qxe + mvb: the GPU test (both), then the A/B. (mvbq and launch(fused) were removed after it: commit 3340ce5
# has them and mvb_ab.py's launch(fused) line.)
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 -m pytest -q tests/test_matvec_mma_emulated.py 2>&1 | tail -2
timeout 200 python3 scripts/session12/mvb_ab.py 2>&1 | tail -3
