# Session 12, call 24: mvb's CTA shapes after the ring fix (4 warps: 4 CTAs an SM, for 14336x4096's 896
# bands; 3 blocks ahead), each alone and after qxe.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 200 python3 scripts/session12/mvb_ab.py 2>&1 | tail -3
