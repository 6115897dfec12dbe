# Session 14, call 8: mvb's compute, part by part: with no memory traffic (DIAG_W + DIAG_X), no mma (DIAG_NOMMA: 2 LOP3s
# in each one's place), no signed-table lookups (DIAG_NOTAB), no grid-copy lookups (DIAG_NOGRID). Wrong products on purpose.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session14/mvb_ab14.py --diag2 2>&1 | tail -16
