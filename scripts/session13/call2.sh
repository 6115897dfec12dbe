# Session 13, call 2: mvb's compute spread over its CTAs, and the signed table made in each CTA
# (scripts/session13/mvb_spread.py).
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session13/mvb_spread.py 2>&1 | tail -120
