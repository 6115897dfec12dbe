# Session 12, call 15 (after 13, 14: qxe, the quantizer that lets the product launch before it waits, so that mvb's first loads meet the previous kernel's tail): why the kernel table's IQ3_XXS_B16 (14.3 us at 4096x14336) is slower than the
# prototype's mvi (11.0): mvb alone by (warps, prefetch), and through launch() (qx + mvb).
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session12/mvb_ab.py 2>&1 | tail -5
