# Session 13, call 3: one CTA of 16 warps an SM over 2 bands (scripts/session13/mvb_w16.py).
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session13/mvb_w16.py 2>&1 | tail -60
