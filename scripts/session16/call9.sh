# Session 16, call 9 (commit "mvbe_ab: the outputs compared as bits ..."): mvbe_ab.py again, the kernel table for the
# issue's types with today's defaults, then the GPU backend's whole test file.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
T0=$(date +%s); left() { echo $(( 420 - ($(date +%s) - T0) )); }
PYTHONPATH=/tmp/site:tests timeout 120 python3 scripts/session16/mvbe_ab.py 5 2>&1 | tee $OUT/mvbe.md | tail -11
echo "== kernel table ($(left) s left)"
timeout 150 python3 -m lite.kernels.bench --no-numba IQ3_XXS_B16 IQ3_XXS_G4 Q4_K Q6_K Q8_0 2>&1 | tee $OUT/ktable.md | grep -E "copy|4096x14336"
echo "== GPU backend tests ($(left) s left)"
timeout $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider tests/test_cuda_backend.py 2>&1 | tail -4
echo "== done $(( $(date +%s) - T0 )) s"
