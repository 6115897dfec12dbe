"""IQ quant kernels against gguf-py: dequantize exactly (fp32) / to fp16 rounding, fused matvec to 1e-3.

Then IQ3_XXS's GPU layouts: lite/backends/cuda.py `_regroup_iq3` with kernels/gpu_layout.py's choice of
layout, run on the host over NumPy blocks (the repacks take NumPy or CuPy): with iq3_layout="groups4"
every 2-D IQ3_XXS matrix becomes IQ3_XXS_G4, with "file" none is repacked; by default ("bands16") those
of whole bands of 16 rows become IQ3_XXS_B16, token_embd (looked up by rows) and a group with a member
of ragged rows stay G4, and a fused group's members are byte ranges of its records that hold their own
rows.

Last, IQ3_XXS's CUDA C dequantize (kernels/dequant_iq.py iq3_cuda_source), run on the host through
tests/cuda_c_emulator.py against gguf-py's dequantize (rounded to fp16): the whole-tensor kernels in
both layouts (the file's, and IQ3_XXS_G4, kernels/iq3_groups.py), and the gathered dequantize for
the MoE prefill (iq3xxs_gather_f16, taken by kernels/moe_layer.gather_dequant_kernel).
"""
import zlib

import numpy as np
import pytest

import cuda_c_emulator as emu
from kernel_blocks import random_blocks, reference, reference_f16
from cuda_c_emulator import HOST_SHIMS

from lite import kernels as K
from lite.backend_config import BackendConfig
from lite.backends import cuda
from lite.backends.cuda_moe import _Weight
from lite.kernels import dequant_iq, gpu_layout, iq3_b16, iq3_groups, iq_tables, matvec_iq, quant_info

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


@pytest.mark.parametrize("name", ["IQ3_XXS", "IQ4_XS"])
@pytest.mark.parametrize("n", [1, 3])
def test_matvec_matches_float64_reference(name, n):
    rng = np.random.default_rng(zlib.crc32(f"{name}{n}".encode()))
    rows, cols = 3, 512
    blocks = random_blocks(name, rows * cols // 256, rng)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    w = reference(blocks, name).astype(np.float64).reshape(rows, cols)
    expect = x.astype(np.float64) @ w.T
    got = _to_host(K.matvec(_to_device(blocks), name, _to_device(x), rows, cols))
    assert got.shape == (n, rows) and got.dtype == np.float32
    # relative to the size of the terms, so that a row whose scales are zero (a real case) counts
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T + 1e-30
    assert np.all(np.abs(got - expect) <= 1e-3 * scale)
    assert np.any(expect != 0)


def test_matvec_vector_x_and_bad_shapes():
    rng = np.random.default_rng(7)
    blocks = random_blocks("IQ4_XS", 2, rng)
    x = rng.standard_normal(256).astype(np.float32)
    got = _to_host(K.matvec(_to_device(blocks), "IQ4_XS", _to_device(x), 2, 256))
    expect = reference(blocks, "IQ4_XS").astype(np.float64).reshape(2, 256) @ x.astype(np.float64)
    np.testing.assert_allclose(got, expect, rtol=1e-3, atol=1e-3 * np.abs(expect).max())
    with pytest.raises(ValueError):
        K.matvec(_to_device(blocks), "IQ4_XS", _to_device(x[:128]), 2, 256)


@pytest.mark.skipif(K.SIMULATOR, reason="the CUDA C kernels run only on a GPU")
@pytest.mark.parametrize("name", ["IQ3_XXS", "IQ4_XS"])
def test_cuda_c_matches_numba_on_gpu(name, monkeypatch):
    import cupy
    rng = np.random.default_rng(11)
    rows, cols = 37, 2048                      # rows not a multiple of the 4 a CUDA block takes
    blocks = cupy.asarray(random_blocks(name, rows * cols // 256, rng))
    x = cupy.asarray(rng.standard_normal((5, cols)).astype(np.float32))
    from lite.kernels import matvec_iq, matvec_q8
    used, q8 = [], []
    real, real_q8 = matvec_iq.persistent_launch, matvec_q8.launch
    monkeypatch.setattr(matvec_iq, "persistent_launch", lambda *a, **k: used.append(1) or real(*a, **k))
    monkeypatch.setattr(matvec_q8, "launch", lambda *a, **k: q8.append(1) or real_q8(*a, **k))
    results = {}
    for impl in ("cuda", "numba"):
        ref = impl == "numba"
        results[impl] = (K.matvec(blocks, name, x, rows, cols, reference=ref).get(),
                         K.dequantize(blocks, name, np.float16, reference=ref).get())
    np.testing.assert_allclose(results["cuda"][0], results["numba"][0], rtol=1e-4,
                               atol=1e-4 * np.abs(results["numba"][0]).max())
    np.testing.assert_array_equal(results["cuda"][1].view(np.uint16), results["numba"][1].view(np.uint16))
    # IQ3_XXS: the integer-dot kernel (kernels/matvec_q8.py, the default) must have run
    assert bool(q8) == matvec_q8.applies(name), q8
    assert bool(used) == (not q8 and name == "IQ3_XXS"), used    # the persistent kernel for n = 1


@pytest.mark.skipif(K.SIMULATOR, reason="the CUDA C kernels run only on a GPU")
def test_iq3_xxs_cuda_c_kernels_match_float64():
    # IQ3_XXS's CUDA C kernels over float x, on 37 rows (not a multiple of any rows a CTA), n = 1, 2
    # and 3 (the persistent kernel takes n = 1; n = 2 and n = 3 = 2 + 1 the register kernel)
    import cupy
    rng = np.random.default_rng(13)
    rows, cols = 37, 2048
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    expect = x.astype(np.float64) @ w.T
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T + 1e-30
    for n in (1, 2, 3):
        out = cupy.full((n, rows), np.nan, np.float32)
        matvec_iq.launch_cuda("IQ3_XXS", cupy.asarray(blocks), cupy.asarray(x[:n]), out, rows, cols, None,
                              int8_dot_types=())
        assert np.all(np.abs(out.get() - expect[:n]) <= 1e-5 * scale[:n] + 1e-4 * np.abs(expect[:n]))


def test_regrouped_iq3xxs_dequantizes_as_the_file_layout():
    """IQ3_XXS_G4 (kernels/iq3_groups.py: a row's blocks by fours, each field together, the signs
    placed): the same values as the file's blocks, whole rows and a row range (the embedding's
    lookups), exactly in fp32 and fp16. In CI the Numba kernel (dequant_iq._p_iq3_xxs_g4), on a GPU
    the CUDA C one."""
    rng = np.random.default_rng(41)
    rows, cols = 3, 2048
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    grouped = iq3_groups.repack(blocks, rows, cols)
    dev = _to_device(grouped)
    out32 = _to_host(K.dequantize(dev, iq3_groups.NAME, np.float32))
    np.testing.assert_array_equal(out32, reference(blocks, "IQ3_XXS"))
    out16 = _to_host(K.dequantize(dev, iq3_groups.NAME, np.float16))
    np.testing.assert_array_equal(out16.view(np.uint16), reference_f16(blocks, "IQ3_XXS").view(np.uint16))
    rb = grouped.size // rows                              # row 1 alone
    one = _to_host(K.dequantize(dev[rb:2 * rb], iq3_groups.NAME, np.float32))
    np.testing.assert_array_equal(one, reference(blocks, "IQ3_XXS")[cols:2 * cols])
    with pytest.raises(ValueError, match="groups of four"):              # not whole groups: refused
        K.dequantize(dev[:3 * 102], iq3_groups.NAME, np.float32)
    # blocks only 2-aligned (the CUDA C kernel reads 32-bit words): the Numba kernel, the same values
    shifted = _to_device(np.concatenate([np.zeros(2, np.uint8), grouped]))[2:]
    np.testing.assert_array_equal(_to_host(K.dequantize(shifted, iq3_groups.NAME, np.float32)),
                                  reference(blocks, "IQ3_XXS"))


def test_regrouped_iq3xxs_matvec_matches_float64_or_refuses():
    """The decode product of IQ3_XXS_G4 weights (matvec_q8's x quantizer + matvec_with_init<Iq3XxsGroup4Int8X>) on the GPU, within the
    bound of the raw layout's; without the GPU kernels (CI) a clear error, never wrong numbers."""
    rng = np.random.default_rng(43)
    rows, cols = 5, 3072
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, rng)
    x = rng.standard_normal((2, cols)).astype(np.float32)
    dev, xd = _to_device(iq3_groups.repack(blocks, rows, cols)), _to_device(x)
    if not iq3_groups.applies():
        with pytest.raises(ValueError, match="integer-dot"):
            K.matvec(dev, iq3_groups.NAME, xd, rows, cols)
        return
    w = reference(blocks, "IQ3_XXS").astype(np.float64).reshape(rows, cols)
    expect = x.astype(np.float64) @ w.T
    got = _to_host(K.matvec(dev, iq3_groups.NAME, xd, rows, cols))
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T + 1e-30
    assert np.all(np.abs(got - expect) <= 1e-3 * scale)


def test_table_headers_match_gguf_tables():
    """kernels/cuda's table headers are gguf-py's tables as the generators write them."""
    from lite.kernels import dequant_iq, iq_tables
    from lite.kernels.cuda_source import source
    assert dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS") in source("iq3_grid.cuh")
    assert iq_tables.c_offset_tables() in source("iq3_offset_tables.cuh")
    kv = ", ".join(str(int(v)) for v in iq_tables.KVALUES_IQ4)
    assert f"__device__ const int IQ4_KVALUES[16] = {{{kv}}};" in source("iq4_values.cuh")
    m = iq_tables.sign_masks()
    masks = ", ".join(f"{{{int(a):#x}u, {int(b):#x}u}}" for a, b in m)
    assert f"IQ3XXS_SMASK2[128] = {{{masks}}};" in source("iq3_sign_masks.cuh")
    words = ", ".join(f"{int(v)}u" for v in iq_tables.table_words())
    assert f"= {{{words}}};" in source("iq3_signed_grid_words.cuh")


# --- IQ3_XXS's GPU layouts: the choice and the repack ------------------------------------------------

class _Stub:                 # the attributes _regroup_iq3 reads
    def __init__(self, w, fused, iq3_layout="bands16"):
        self.w, self.fused, self.config = w, fused, BackendConfig(iq3_layout=iq3_layout, reference_kernels=False)


def _weight(name, rows, cols, rng):
    return _Weight(name, "IQ3_XXS", (rows, cols), random_blocks("IQ3_XXS", rows * cols // 256, rng).reshape(-1))


def _model(rng):
    w = {n: _weight(n, r, 1024, rng) for n, r in (("token_embd.weight", 64), ("blk.0.attn_q.weight", 32),
                                                   ("blk.0.attn_k.weight", 16), ("blk.0.ffn_down.weight", 48),
                                                   ("blk.0.attn_output.weight", 40))}
    members = ("blk.0.attn_q.weight", "blk.0.attn_k.weight")
    group = _Weight("+".join(members), "IQ3_XXS", (48, 1024),
                    np.concatenate([w[m].data for m in members]))
    for m, off in zip(members, (0, w[members[0]].data.size)):
        w[m].data = group.data[off:off + w[m].data.size]
    return w, {members: (group, [32, 16], False)}, members


@pytest.mark.parametrize("b16", [False, True], ids=["g4", "b16"])
def test_regroup_layouts(monkeypatch, b16):
    rng = np.random.default_rng(3)
    w, fused, members = _model(rng)
    before = {n: x.data.copy() for n, x in w.items()}
    monkeypatch.setattr(iq3_groups, "applies", lambda *a: True)
    cuda.CUDABackend._regroup_iq3(_Stub(w, fused, "bands16" if b16 else "groups4"))
    want = {"token_embd.weight": iq3_groups, "blk.0.attn_output.weight": iq3_groups}   # 40 rows: not whole bands
    for n in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight"):
        want[n] = iq3_b16 if b16 else iq3_groups
    for n, mod in want.items():
        x = w[n]
        assert x.qtype == mod.NAME, n
        assert np.array_equal(x.data, mod.repack(before[n], *x.shape)), n      # its own rows, repacked
    group = fused[members][0]
    assert group.qtype == want[members[0]].NAME
    assert np.array_equal(group.data, np.concatenate([w[m].data for m in members]))


def test_regroup_keeps_a_group_with_ragged_rows_in_g4(monkeypatch):
    rng = np.random.default_rng(5)
    w = {n: _weight(n, r, 1024, rng) for n, r in (("blk.0.attn_q.weight", 24), ("blk.0.attn_v.weight", 8))}
    members = tuple(w)       # 32 rows together (whole bands), but the members' byte ranges would cut a band
    group = _Weight("+".join(members), "IQ3_XXS", (32, 1024), np.concatenate([w[m].data for m in members]))
    fused = {members: (group, [24, 8], False)}
    monkeypatch.setattr(iq3_groups, "applies", lambda *a: True)
    cuda.CUDABackend._regroup_iq3(_Stub(w, fused))
    assert group.qtype == iq3_groups.NAME and all(w[m].qtype == iq3_groups.NAME for m in members)


def test_file_layout_repacks_nothing(monkeypatch):
    rng = np.random.default_rng(4)
    w, fused, members = _model(rng)
    before = {n: x.data.copy() for n, x in w.items()}
    monkeypatch.setattr(iq3_groups, "applies", lambda *a: True)
    cuda.CUDABackend._regroup_iq3(_Stub(w, fused, "file"))
    assert all(x.qtype == "IQ3_XXS" and np.array_equal(x.data, before[n]) for n, x in w.items())


def test_gpu_layout_choice():
    """One function chooses (kernels/gpu_layout.py): the CUDA C kernels with IQ3_XXS on dp4a are needed."""
    on = dict(reference=False)
    assert gpu_layout.gpu_layout("Q4_K", (4096, 4096), **on) == "Q4_K"
    if iq3_groups.applies():           # (a GPU's CUDA C kernels; in the simulator never)
        assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), **on) == iq3_b16.NAME
        assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), looked_up=True, **on) == iq3_groups.NAME
        assert gpu_layout.gpu_layout("IQ3_XXS", (40, 4096), **on) == iq3_groups.NAME
        assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), iq3_layout="groups4", **on) == iq3_groups.NAME
    assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), iq3_layout="file") == "IQ3_XXS"
    assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), int8_dot_types=("Q4_K",)) == "IQ3_XXS"
    assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), reference=True) == "IQ3_XXS"
    assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 768)) == "IQ3_XXS"           # not whole groups
    with pytest.raises(ValueError, match="iq3_layout"):
        gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), iq3_layout="b16")


def test_interleave_and_x_records_choices():
    assert gpu_layout.interleaves_gate_up("Q4_K") and gpu_layout.interleaves_gate_up("Q6_K", ())
    assert gpu_layout.interleaves_gate_up("IQ3_XXS") and not gpu_layout.interleaves_gate_up("IQ3_XXS", ("Q4_K",))
    assert not gpu_layout.interleaves_gate_up("IQ4_XS")
    assert gpu_layout.reads_x_records(iq3_b16.NAME) and not gpu_layout.reads_x_records(iq3_groups.NAME)


def test_regroup_needs_whole_groups_and_unpacks():
    with pytest.raises(ValueError, match="1024"):
        iq3_groups.repack(np.zeros(3 * 98, np.uint8), 1, 768)
    blocks = random_blocks("IQ3_XXS", 3 * 8, np.random.default_rng(3))
    assert np.array_equal(iq3_groups.unpack(iq3_groups.repack(blocks, 3, 2048), 3, 2048), blocks.reshape(-1))
    # the layout's sizes agree where they are written down (registry's bytes a block, the module's group)
    assert quant_info(iq3_groups.NAME).type_size * 4 == iq3_groups.GROUP_BYTES == iq3_groups.nbytes(1, 1024)


def test_regrouped_rows_stay_whole_so_fused_members_slice_by_nbytes():
    """lite/backends/cuda.py _regroup_iq3 repacks a fused [q; k; v] buffer whole and slices its
    members iq3_groups.nbytes apart: those slices are each member's own repack."""
    rng = np.random.default_rng(5)
    a, b = random_blocks("IQ3_XXS", 3 * 8, rng), random_blocks("IQ3_XXS", 2 * 8, rng)
    whole = iq3_groups.repack(np.concatenate([a.reshape(-1), b.reshape(-1)]), 5, 2048)
    cut = iq3_groups.nbytes(3, 2048)
    assert whole.size == iq3_groups.nbytes(5, 2048)
    assert np.array_equal(whole[:cut], iq3_groups.repack(a, 3, 2048))
    assert np.array_equal(whole[cut:], iq3_groups.repack(b, 2, 2048))


# --- IQ3_XXS's CUDA C dequantize under the emulator -----------------------------------------------
# The launch contract lite/backends/cuda_moe.py relies on: row y of the output is expert sel[y], read
# at slot slot_of[sel[y]] of the source (slot_of null: at the expert's own index); sel -1 and experts
# without a slot (-1) leave their row untouched.

needs_gxx = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")
EMU_SHIMS = "inline float __fmul_rn(float a, float b) { return a * b; }\n" \
            "inline float __fadd_rn(float a, float b) { return a + b; }\n" \
            "inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }\n"
E, ELEMS = 5, 3 * 256 * 4                      # experts; values an expert (not a multiple of the tile)


@pytest.fixture(scope="module")
def iq3_emu_lib():
    return emu.compile_kernels(HOST_SHIMS + EMU_SHIMS + dequant_iq.c_grid_array("IQ3XXS_GRID", "IQ3_XXS")
                               + dequant_iq.C_IQ3_XXS_DEQUANT)


@needs_gxx
@pytest.mark.parametrize("slots", [False, True])
def test_gathered_rows_are_the_selected_experts(iq3_emu_lib, slots):
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
    iq3_emu_lib.launch("iq3xxs_gather_f16", grid, (256,), src, np.int64(ebytes), out, np.int64(ELEMS), sel,
                       slot_of)
    for y, e in enumerate(sel):
        written = e >= 0 and (slot_of is None or slot_of[e] >= 0)
        expect = want[e] if written else np.full(ELEMS, 7, np.float16)
        assert np.array_equal(out[y].view(np.uint16), expect.view(np.uint16)), (y, e)


@needs_gxx
@pytest.mark.parametrize("grouped", [False, True])
def test_whole_tensor_kernels_both_layouts(iq3_emu_lib, grouped):
    """iq3xxs_deq_f16 / _f32 over the file's blocks and iq3xxs_g4_deq_* over the same regrouped:
    gguf-py's values, exactly in fp32, rounded to fp16 (a grid-stride loop: fewer threads than groups)."""
    rows, cols = 3, 2048
    blocks = random_blocks("IQ3_XXS", rows * cols // 256, np.random.default_rng(11 + grouped))
    src = iq3_groups.repack(blocks, rows, cols) if grouped else blocks
    want = reference(blocks, "IQ3_XXS")
    n_groups = np.int64(rows * cols // 8)
    name = "iq3xxs_g4_deq" if grouped else "iq3xxs_deq"
    out16 = np.zeros(rows * cols, np.float16)
    iq3_emu_lib.launch(f"{name}_f16", (2,), (256,), src, out16, n_groups)
    assert np.array_equal(out16.view(np.uint16), want.astype(np.float16).view(np.uint16))
    out32 = np.zeros(rows * cols, np.float32)
    iq3_emu_lib.launch(f"{name}_f32", (2,), (256,), src, out32, n_groups)
    assert np.array_equal(out32, want)
