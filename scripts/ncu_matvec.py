"""The decode matvec kernels for a profiler: each launched a few times, plainly (no graph), at the
decode step's shapes, so that Nsight Compute can say what binds them (issue 3: Q4_K at 45-53% and
IQ3_XXS at 17-18% of the bandwidth bound; session 3 found neither bound by instruction issue).

    ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section Occupancy --section LaunchStats --launch-skip 2 --launch-count 6 \
        python3 scripts/ncu_matvec.py            # (scripts/ncu_matvec.sh runs this)

Shapes: Q4_K 4096x4096 (attention output), 4096x14336 (down), 28672x4096 (gate/up); Q6_K
4096x14336; IQ3_XXS 4096x14336. Two warm-up launches of each, then the profiled ones.
"""
import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from kernel_blocks import random_blocks  # noqa: E402

from lite.kernels import matvec_cuda as mc, matvec_iq as mi, quant_info  # noqa: E402

CASES = [("Q4_K", 4096, 4096), ("Q4_K", 4096, 14336), ("Q4_K", 28672, 4096), ("Q6_K", 4096, 14336),
         ("IQ3_XXS", 4096, 14336)]


def main():
    only = sys.argv[1:]
    rng = np.random.default_rng(0)
    # in the order the types are named (ncu_matvec.sh profiles the first 20 launches)
    for qt, rows, cols in sorted(CASES, key=lambda c: only.index(c[0]) if c[0] in only else 0):
        if only and qt not in only:
            continue
        w = cp.asarray(random_blocks(qt, rows * cols // quant_info(qt).block_elems, rng))
        x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
        out = cp.empty((1, rows), cp.float32)
        for _ in range(4):
            if qt in mc.CONFIG:
                mc.launch(qt, w, x, out, rows, cols)
            else:
                mi.launch_cuda(qt, w, x, out, rows, cols, None)
        cp.cuda.Device().synchronize()
        print(f"{qt} {rows}x{cols}: {w.nbytes / 1e6:.1f} MB of weights", flush=True)


if __name__ == "__main__":
    main()
