#!/usr/bin/env bash
# Session 10, call 7 (warm or carry .whl): what reading the weights alone takes at the products'
# sizes ("read": 16-byte loads of the same bytes, one wave, timed as the products), beside the
# kernel table's copy-vec16; IQ3_XXS's products on both grouped layouts and Q4_K's for scale.
set -u
source scripts/device_setup.sh >/dev/null 2>&1
O=${OUT:-/tmp}
for t in IQ3_XXS Q4_K; do
  v=read,mvq40s12,mvq40g12; [ $t = Q4_K ] && v=read,mvq20
  timeout 250 python3 tests/gpu_sweep_matvec.py --types $t --variants $v \
      --shapes 4096x14336,14336x4096,4096x4096 2>&1 | tee -a $O/sweep.log | grep -E "^IQ3|^Q4|MISMATCH|mismatches|copy|Error"
done
