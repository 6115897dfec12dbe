# Session 16, call 3 (commit "warps_ab: 1e-4 ..."): warps_ab.py again (call 2 stopped at its own 1e-5 check: 12 warps
# differ from 8 by 3.4e-5 of the row's scale, the warps' float sums in another order).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
# ran as warps_ab.py (since folded into forms_ab)
PYTHONPATH=/tmp/site:tests timeout 300 python3 scripts/session16/forms_ab.py 5 --warps 2>&1 | tee $OUT/warps.md | tail -20
