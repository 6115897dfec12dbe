# Session 16, call 5 (commit "scripts/session16: timeline16.py ..."): the timeline of mvb<8, 1, 1, 0> / SG = 1, each with
# and without LT_MVB_PREDECODE, at 4096x14336 after qxe, with their graph times alone and after qxe.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session16/timeline16.py 2>&1 | tee $OUT/timeline.md | tail -8
