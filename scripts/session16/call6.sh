# Session 16, call 6 (commit "mvb: D, the first block decoded before the PDL wait, a template parameter ..."): the mma
# file's GPU tests (full size, the D forms among the CTA shapes), then forms_ab.py (SG x D at the 8-warp shapes).
set -u
source scripts/device_setup.sh >/dev/null 2>&1
timeout 150 python3 -m pytest -q -x tests/test_matvec_mma_emulated.py -k "gpu" 2>&1 | tail -2
PYTHONPATH=/tmp/site:tests timeout 300 python3 scripts/session16/forms_ab.py 5 2>&1 | tee $OUT/forms.md | tail -20
