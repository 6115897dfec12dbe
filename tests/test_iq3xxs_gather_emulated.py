"""IQ3_XXS's CUDA C dequantize (kernels/dequant_iq.py iq3_cuda_source), run on the host through
tests/cuda_c_emulator.py against gguf-py's dequantize (rounded to fp16): the whole-tensor kernels in
both layouts (the file's, and IQ3_XXS_G4, kernels/iq3_groups.py), and the gathered dequantize for
the MoE prefill (iq3xxs_gather_f16, taken by kernels/moe_layer.gather_dequant_kernel).

The launch contract lite/backends/cuda_moe.py relies on: row y of the output is expert sel[y], read
at slot slot_of[sel[y]] of the source (slot_of null: at the expert's own index); sel -1 and experts
without a slot (-1) leave their row untouched.
"""
import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference
from test_kernels_matvec_emulated import HOST_SHIMS

from lite.kernels import dequant_iq

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

SHIMS = "inline float __fmul_rn(float a, float b) { return a * b; }\n" \
           "inline float __fadd_rn(float a, float b) { return a + b; }\n" \
           "inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }\n"
E, ELEMS = 5, 3 * 256 * 4                      # experts; values an expert (not a multiple of the tile)


@pytest.fixture(scope="module")
def lib():
    return emu.compile_kernels(HOST_SHIMS + SHIMS + dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS")
                               + dequant_iq.C_IQ3_XXS_DEQUANT)


@pytest.mark.parametrize("slots", [False, True])
def test_gathered_rows_are_the_selected_experts(lib, slots):
    rng = np.random.default_rng(5 + slots)
    blocks = random_blocks("IQ3_XXS", E * ELEMS // 256, rng)
    want = reference(blocks, "IQ3_XXS").reshape(E, ELEMS).astype(np.float16)
    ebytes = blocks.size // E
    sel = np.array([3, -1, 0, 4], np.int32)
    if slots:          # the cache: slot s holds expert order[s]; expert 4 has no slot this round
        order = [2, 0, 1, 3]
        src = np.concatenate([blocks[e * ebytes:(e + 1) * ebytes] for e in order])
        slot_of = np.array([order.index(e) if e in order else -1 for e in range(E)], np.int32)
    else:
        src, slot_of = blocks, None
    out = np.full((len(sel), ELEMS), 7, np.float16)                 # 7: rows never written
    grid = (-(-ELEMS // dequant_iq.IQ3_GATHER_TILE), len(sel))
    lib.launch("iq3xxs_gather_f16", grid, (256,), src, np.int64(ebytes), out, np.int64(ELEMS), sel,
               slot_of)
    for y, e in enumerate(sel):
        written = e >= 0 and (slot_of is None or slot_of[e] >= 0)
        expect = want[e] if written else np.full(ELEMS, 7, np.float16)
        assert np.array_equal(out[y].view(np.uint16), expect.view(np.uint16)), (y, e)


@pytest.mark.parametrize("grouped", [False, True])
def test_whole_tensor_kernels_both_layouts(lib, grouped):
    """iq3xxs_deq_f16 / _f32 over the file's blocks and iq3xxs_g4_deq_* over the same regrouped:
    gguf-py's values, exactly in fp32, rounded to fp16 (a grid-stride loop: fewer threads than groups)."""
    from lite.kernels import iq3_groups
    rows, cols = 3, 2048
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, np.random.default_rng(11 + grouped))
    src = iq3_groups.repack(blocks, rows, cols) if grouped else blocks
    want = reference(blocks, "IQ3_XXS")
    n_groups = np.int64(rows * cols // 8)
    name = "iq3xxs_g4_deq" if grouped else "iq3xxs_deq"
    out16 = np.zeros(rows * cols, np.float16)
    lib.launch(f"{name}_f16", (2,), (256,), src, out16, n_groups)
    assert np.array_equal(out16.view(np.uint16), want.astype(np.float16).view(np.uint16))
    out32 = np.zeros(rows * cols, np.float32)
    lib.launch(f"{name}_f32", (2,), (256,), src, out32, n_groups)
    assert np.array_equal(out32, want)
