# Session 16, call 4 (commit "mvb: LT_MVB_PREDECODE ..."): predecode_ab.py (each warp's first block decoded before the
# PDL wait) at the table's shapes, 7 rounds.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
# ran as predecode_ab.py (the define LT_MVB_PREDECODE; since D)
PYTHONPATH=/tmp/site:tests timeout 300 python3 scripts/session16/forms_ab.py 7 --d 2>&1 | tee $OUT/predecode.md | tail -12
