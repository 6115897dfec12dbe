# Session 14, call 2: session 13's mvb with its weights not allocated in L1 (LT_MVB_L1NA) and / or the next block's
# x loaded in halves as this block's chunk pairs finish (LT_MVB_XSPLIT), against session 13's text.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 500 python3 scripts/session14/mvb_ab14.py --timeline 2>&1 | tail -54
