# Session 16, call 2 (commit "scripts/session16: warps_ab ..."): the hand-off chain test again with its detail (call 1:
# it failed), mvb's warps a CTA at the table's shapes (warps_ab.py), then session 15's call 9 (pp4096, B16 / G4 /
# llama.cpp) with what time is left. Carry .whl and .llb.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
T0=$(date +%s)
timeout 120 python3 -m pytest -q -x tests/test_matvec_mma_emulated.py -k "handoff_chain" 2>&1 | grep -E "assert|Error|passed|failed" | head -12
echo "== warps ($(( $(date +%s) - T0 )) s)"
# ran as warps_ab.py
PYTHONPATH=/tmp/site:tests timeout 240 python3 scripts/session16/forms_ab.py 5 --warps 2>&1 | tee $OUT/warps.md | tail -20
echo "== call9 ($(( $(date +%s) - T0 )) s)"
[ $(( $(date +%s) - T0 )) -lt 330 ] && timeout $(( 590 - ($(date +%s) - T0) )) bash scripts/session15/call9.sh
echo "== done $(( $(date +%s) - T0 )) s"
