"""Dequantize kernels (float, legacy and K types) against gguf-py, under the simulator in CI."""
import numpy as np
import pytest

from conftest import HAS_GPU
from kernel_blocks import random_blocks, reference
from lite.errors import UnsupportedQuantError
from lite.kernels import dequantize
from lite.kernels.dequant_basic import KERNELS

BASIC = ["F16", "BF16", "F32", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]
K_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _blocks(qtype, n_blocks, seed):
    return random_blocks(qtype, n_blocks, np.random.default_rng(seed))


def _dq(blocks, qtype, dtype, out=None):
    """dequantize() on the device the tests run on (NumPy arrays under the simulator)."""
    if not HAS_GPU:
        return dequantize(blocks, qtype, dtype, out=out)
    import cupy
    res = dequantize(cupy.asarray(blocks), qtype, dtype, out=None if out is None else cupy.asarray(out))
    if out is not None:
        out[:] = res.get()
        return out
    return res.get()


@pytest.mark.parametrize("qtype", BASIC + K_TYPES)
def test_matches_reference_fp32_and_fp16(qtype):
    be = KERNELS[qtype].be
    n_blocks = 40 if be == 1 else (6 if be == 32 else 5)   # float types: 40 values, not a multiple of 8
    blocks = _blocks(qtype, n_blocks, 1)
    ref = reference(blocks, qtype)
    got32 = _dq(blocks, qtype, np.float32)
    np.testing.assert_array_equal(got32.view(np.uint32), ref.view(np.uint32))
    got16 = _dq(blocks, qtype, np.float16)
    np.testing.assert_array_equal(got16.view(np.uint16), ref.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("qtype,n_blocks", [("Q4_K", 33), ("Q8_0", 257)])
def test_several_tiles_with_a_partial_last_one(qtype, n_blocks):
    assert n_blocks * KERNELS[qtype].be > KERNELS[qtype].tile_elems()
    blocks = _blocks(qtype, n_blocks, 2)
    got = _dq(blocks, qtype, np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), reference(blocks, qtype).astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("qtype", ["Q6_K", "Q5_0", "BF16"])
def test_unaligned_slice_and_given_out(qtype):
    blocks = _blocks(qtype, 3, 3)
    buf = np.zeros(blocks.size + 3, dtype=np.uint8)
    buf[1:1 + blocks.size] = blocks                   # odd byte offset, odd total size
    view = buf[1:1 + blocks.size]
    ref = reference(blocks, qtype)
    out = np.full(ref.size, np.nan, dtype=np.float32)
    res = _dq(view, qtype, np.float32, out=out)
    assert res is out
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))


def test_empty_input_gives_empty_output():
    assert _dq(np.zeros(0, dtype=np.uint8), "Q4_K", np.float16).shape == (0,)


@pytest.mark.skipif(HAS_GPU, reason="host-array argument checks")
def test_bad_inputs_raise_clear_errors():
    blocks = _blocks("Q4_0", 2, 4)
    with pytest.raises(ValueError, match="whole number"):
        dequantize(blocks[:-1], "Q4_0")
    with pytest.raises(ValueError, match="out must be"):
        dequantize(blocks, "Q4_0", out=np.empty(63, np.float16))
    with pytest.raises(ValueError, match="out_dtype"):
        dequantize(blocks, "Q4_0", np.float64)
    with pytest.raises(ValueError, match="whole"):
        KERNELS["Q4_0"](blocks[:-1], np.empty(32, np.float16), None)
    with pytest.raises(UnsupportedQuantError):
        dequantize(blocks, "Q8_K")


def test_random_blocks_hold_every_kind_of_scale():
    # The edge cases the kernels are checked on must really be in the blocks.
    blocks = _blocks("Q8_0", 16, 5).reshape(16, 34)
    d = blocks[:, :2].copy().view(np.float16).ravel()
    bits = d.view(np.uint16)
    assert (d > 0).any() and (d < 0).any()
    assert ((bits & 0x7FFF) == 0).any()
    assert (((bits & 0x7C00) == 0) & ((bits & 0x03FF) != 0)).any()      # subnormal
    assert np.isfinite(reference(blocks.ravel(), "Q8_0")).all()


@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU: full-size CUDA C and Numba kernels vs gguf-py")
@pytest.mark.parametrize("qtype", BASIC + K_TYPES)
def test_gpu_full_size_both_implementations(qtype):
    import cupy
    k = KERNELS[qtype]
    rows = 4096 if qtype in ("Q4_K", "Q6_K", "Q8_0") else 512
    n_blocks = rows * 4096 // k.be
    blocks = _blocks(qtype, n_blocks, 7)
    ref32 = reference(blocks, qtype)
    want = {np.float16: ref32.astype(np.float16).view(np.uint16), np.float32: ref32.view(np.uint32)}
    dev = cupy.asarray(blocks)
    for impl in ("cuda", "numba"):
        for dtype in (np.float16, np.float32):
            out = cupy.empty(n_blocks * k.be, dtype=dtype)
            k.launch(dev, out, None, impl)
            got = out.get()
            got = got.view(np.uint16 if dtype == np.float16 else np.uint32)
            np.testing.assert_array_equal(got, want[dtype], err_msg=f"{impl} {np.dtype(dtype).name}")
