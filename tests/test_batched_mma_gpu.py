"""kernels/batched_mma.py on the GPU at full size (skipped without one; the emulated twin on small shapes:
tests/test_batched_mma_emulated.py): 4096 x 4096 and 14336 x 4096 weights of every type it takes (IQ3_XXS in
each of the GPU backend's layouts) with 9, 64 and 256 rows of x, against float64 within the bound of that test,
against today's path (the 8-row fused matvecs), and the product captured in a CUDA graph replaying to the same
bytes. Prints each shape's time beside the 8-row matvecs' and the fp16 dequantization + cuBLAS's (for the lead's
notes; nothing asserted on it)."""
import numpy as np
import pytest

from kernel_blocks import reference
from lite.backends import cuda_unavailable_reason
from lite.kernels import batched_mma
from test_batched_mma_emulated import _x, quant_error, weight as random_weight

GPU_WHY = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(GPU_WHY is not None, reason=f"needs a GPU: {GPU_WHY}")
SHAPES = [(4096, 4096), (14336, 4096)]


@pytest.fixture(scope="module", params=[(qt, s) for qt in batched_mma.TYPES for s in SHAPES],
                ids=lambda p: f"{p[0]}-{p[1][0]}x{p[1][1]}")
def weight(request):
    """(qtype or layout, rows, cols, device bytes as the product reads them, float64 weight on the device)."""
    import cupy
    qt, (rows, cols) = request.param
    data, ft, blocks = random_weight(qt, rows, cols, np.random.default_rng(rows + cols))
    w64 = cupy.asarray(reference(blocks, ft).reshape(rows, cols)).astype(np.float64)
    return qt, rows, cols, cupy.asarray(data), w64


def _ms(fn, reps=20):
    import cupy
    fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / reps


@pytest.mark.parametrize("n", [9, 64, 256])
def test_batched_product_on_the_gpu(weight, n):
    import cupy

    from lite.backends.cuda_linear import gemm_f16_f32
    from lite.kernels import gpu_layout, matvec
    qt, rows, cols, blocks, w64 = weight
    x = _x(n, cols, np.random.default_rng(n))
    xd = cupy.asarray(x)
    out = batched_mma.product(qt, blocks, xd, rows, cols)
    ref = cupy.asarray(x).astype(np.float64) @ w64.T
    aw = cupy.abs(w64)
    bound = 1e-5 * (cupy.abs(xd).astype(np.float64) @ aw.T) + cupy.asarray(quant_error(x)) @ aw.T
    err = cupy.abs(out.astype(np.float64) - ref)
    assert bool(cupy.all(err <= bound)), float(cupy.max(err - bound))

    def today():
        return cupy.concatenate([matvec(blocks, qt, xd[r:r + 8], rows, cols) for r in range(0, n, 8)])
    old = today()                              # the 8-row matvecs: within their own bound of float64 too
    assert bool(cupy.all(cupy.abs(out.astype(np.float64) - old) <= 2 * bound + 1e-3 * cupy.abs(ref)))

    stream = cupy.cuda.Stream(non_blocking=True)
    again = cupy.empty_like(out)
    with stream:
        stream.begin_capture()
        batched_mma.launch(qt, blocks, xd, again, rows, cols)
        graph = stream.end_capture()
        again[...] = np.nan
        graph.launch(stream)
    stream.synchronize()
    assert bool(cupy.all(again == out))        # captured: no cuBLAS, no host sync

    w16 = cupy.empty(rows * cols, np.float16)

    def dequant_gemm():
        gpu_layout.dequantize_matrix(blocks, qt, rows, cols, np.float16, out=w16)
        return gemm_f16_f32(cupy, xd.astype(np.float16), w16.reshape(rows, cols), cupy.cuda.get_current_stream())
    print(f"\n{qt} {rows}x{cols} n={n}: batched_mma {_ms(lambda: batched_mma.product(qt, blocks, xd, rows, cols)):.3f} ms,"
          f" 8-row matvecs {_ms(today):.3f} ms, fp16 dequant + cuBLAS {_ms(dequant_gemm):.3f} ms")
