"""kernels/bench.py's copy16 (the copy-bandwidth reference of `lite bench kernels`, session 7) on the
host through tests/cuda_c_emulator.py: every 16-byte element copied, whatever the count against the
grid's stride (the unrolled part and the tail)."""
import numpy as np
import pytest

import cuda_c_emulator as emu
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import bench

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")


@pytest.mark.parametrize("n16", [1, 255, 256 * 2 * 4, 256 * 2 * 4 + 17, 5000])
def test_copy16_copies_every_element(n16):
    lib = emu.compile_kernels(HOST_SHIMS + bench.C_COPY16)
    src = np.random.default_rng(n16).integers(0, 2**32, 4 * n16, dtype=np.uint64).astype(np.uint32)
    dst = np.zeros_like(src)
    lib.launch("copy16", (2,), (256,), src, dst, np.int64(n16))
    np.testing.assert_array_equal(dst, src)


def test_graphs_hold_milliseconds_of_launches():
    """A timed graph runs for several milliseconds at the device's bandwidth (MAX_LAUNCHES of a 22.5 MB
    matrix product, 4096x14336 IQ3_XXS: session 13 found 11 there, ~0.4 us of graph overhead on each),
    never fewer than 10 launches."""
    assert bench._launches_for(22_478_848) == bench.MAX_LAUNCHES
    for nbytes in (150 << 20, 1 << 30, 8 << 30):
        n = bench._launches_for(nbytes)
        assert 10 <= n < bench.MAX_LAUNCHES
        assert n * nbytes / bench.DEVICE_BYTES_PER_S >= min(0.8 * bench.GRAPH_SECONDS, 10 * nbytes / bench.DEVICE_BYTES_PER_S)
