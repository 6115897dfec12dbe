# Session 14, call 6: where mvb's time goes, by diagnostics that take a traffic away (wrong products on purpose):
# the weights from 2 records a band (no DRAM), x from the first block (no L2 reads), both.
source scripts/device_setup.sh >/dev/null 2>&1
timeout 300 python3 scripts/session14/mvb_ab14.py --diag 2>&1 | tail -16
