"""IQ quant kernels against gguf-py: dequantize exactly (fp32) / to fp16 rounding, fused matvec to 1e-3."""
import zlib

import numpy as np
import pytest

from kernel_blocks import random_blocks, reference, reference_f16
from lite import kernels as K
from lite.kernels import iq_tables

IQ_TYPES = ["IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS"]


def _to_device(a):
    if K.SIMULATOR:
        return a
    import cupy
    return cupy.asarray(a)


def _to_host(a):
    return a if isinstance(a, np.ndarray) else a.get()


def test_ksigns_is_parity_completed_index():
    table = iq_tables.ksigns()
    assert [iq_tables.ksigns_formula(i) for i in range(128)] == table.tolist()
    assert all(bin(int(v)).count("1") % 2 == 0 for v in table)


@pytest.mark.parametrize("name,entries", [("IQ2_XXS", 256), ("IQ2_XS", 512), ("IQ2_S", 1024),
                                          ("IQ3_XXS", 256), ("IQ3_S", 512), ("IQ1_S", 2048)])
def test_packed_grid_unpacks_to_gguf_values(name, entries):
    packed = iq_tables.grid_packed(name)
    values = iq_tables.grid_values(name)
    assert packed.shape == (entries,)
    unpacked = packed.view(np.uint8).reshape(entries, -1).astype(np.float32)
    if name.startswith("IQ1"):
        unpacked -= 1
    np.testing.assert_array_equal(unpacked, values)


@pytest.mark.parametrize("name", IQ_TYPES)
def test_dequantize_matches_gguf(name):
    info = K.quant_info(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n_blocks = 5 if info.block_elems == 256 else 12
    blocks = random_blocks(name, n_blocks, rng)
    dev = _to_device(blocks)
    out32 = _to_host(K.dequantize(dev, name, np.float32))
    np.testing.assert_array_equal(out32, reference(blocks, name))
    out16 = _to_host(K.dequantize(dev, name, np.float16))
    # bit patterns, so that -0.0 and +0.0 are told apart as the reference's cast makes them
    np.testing.assert_array_equal(out16.view(np.uint16), reference_f16(blocks, name).view(np.uint16))
