"""Dequantize kernels (float, legacy and K types) against gguf-py, under the simulator in CI."""
import numpy as np
import pytest

from kernel_blocks import random_blocks, reference
from lite.errors import UnsupportedQuantError
from lite.kernels import dequantize
from lite.kernels.dequant_basic import KERNELS

BASIC = ["F16", "BF16", "F32", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]
K_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _blocks(qtype, n_blocks, seed):
    return random_blocks(qtype, n_blocks, np.random.default_rng(seed))


@pytest.mark.parametrize("qtype", BASIC + K_TYPES)
def test_matches_reference_fp32_and_fp16(qtype):
    be = KERNELS[qtype].be
    n_blocks = 40 if be == 1 else (6 if be == 32 else 5)   # float types: 40 values, not a multiple of 8
    blocks = _blocks(qtype, n_blocks, 1)
    ref = reference(blocks, qtype)
    got32 = dequantize(blocks, qtype, np.float32)
    np.testing.assert_array_equal(got32.view(np.uint32), ref.view(np.uint32))
    got16 = dequantize(blocks, qtype, np.float16)
    np.testing.assert_array_equal(got16.view(np.uint16), ref.astype(np.float16).view(np.uint16))
