# Session 12, call 13 (and 14: beside qx alone, qx + mv_iq2, mv_iq2 alone): why the kernel table's IQ3_XXS_B16 (14.3 us at 4096x14336) is slower than the
# prototype's mvi (11.0): mvb alone by (warps, prefetch), and through launch() (qx + mvb).
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvb_ab.py 2>&1 | tail -5
