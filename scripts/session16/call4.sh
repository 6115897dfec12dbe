# Session 16, call 4 (commit "mvb: LT_MVB_PREDECODE ..."): predecode_ab.py (each warp's first block decoded before the
# PDL wait) at the table's shapes, 7 rounds.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
PYTHONPATH=/tmp/site:tests timeout 300 python3 scripts/session16/predecode_ab.py 7 2>&1 | tee $OUT/predecode.md | tail -12
