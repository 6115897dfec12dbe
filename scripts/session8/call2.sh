#!/usr/bin/env bash
# Session 8, call 2 (carry .whl): quantized x in record layout 1 (LITE_Q8_LAYOUT, kernels/matvec_q8.py)
# against 0 for Q4_K / Q6_K / IQ3_XXS mvq; IQ3_XXS's tables (TIQ3_XXSQV<GC, SC>) in shared memory or
# computed; then the GPU tests with the new defaults (Q6_K, IQ3_XXS and the MoE experts on mvq).
set -u
source scripts/device_setup.sh
O=${OUT:-/tmp}
for lay in 0 1; do
  LITE_Q8_LAYOUT=$lay timeout 100 python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K,IQ3_XXS \
      --variants mvq20,mvq40 --shapes 4096x14336,14336x4096 2>&1 | grep -E "^(Q4_K|Q6_K|IQ3_XXS)|MISMATCH" | sed "s/^/L$lay /"
done | tee $O/layout.log
V=$(python3 -c "
import sys; sys.path.insert(0, 'tests'); import gpu_sweep_matvec as g
print(','.join(f\"mvq{'p' + str(r) if p == 'p' else f'{r}{p}'}t{gc}{sc}\" for r, p, gc, sc in g.IQ3_Q8_VARIANTS))")
LITE_Q8_LAYOUT=1 timeout 200 python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvp8,$V \
    --shapes 4096x14336,4096x4096 > $O/iq3.log 2>&1
grep -E "regs|MISMATCH|mismatches" $O/iq3.log | head -80
python3 - $O/sweep.json <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
for shape in sorted({r["shape"] for r in rows}):
    rs = sorted((r for r in rows if r["shape"] == shape), key=lambda r: r["us"])
    print(shape, " | ".join(f"{r['kernel']} {r['us']:.1f}" for r in rs))
PY
LITE_Q8_LAYOUT=1 timeout 230 python3 -m pytest -q tests/test_matvec_q8_emulated.py tests/test_cuda_backend.py \
    tests/test_experts_mvw.py > $O/tests.log 2>&1
grep -E "^FAILED|^ERROR|passed|failed" $O/tests.log | tail -12
