"""The grouped MoE path's expert products on the GPU backend: the decode product `moe_decode_product`
(kernels/moe_products.py) for the K types and IQ3_XXS / IQ4_XS experts. Each part below keeps its
file's docstring as its first section comment, and its tests as they were.

"""
import numpy as np
import pytest
from kernel_blocks import random_blocks, reference
from lite.backends import cuda_unavailable_reason
from lite.kernels import moe_products as mp
from lite.kernels import quant_info
from lite.files.synth import synth
from test_experts import check_layer_experts_match_cpu
from test_experts import _cpu, _gpu


# ------------------------------------------------------------------------------------------------
# The decode product `moe_decode_product` (kernels/moe_products.py) of the grouped MoE path: which
# launch moe_products.grouped takes (CPU), and on the GPU that a layer's experts match the CPU
# backend. The kernel's CUDA C is also checked on the host by tests/test_moe_kernels_emulated.py.
GPU_WHY = cuda_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_WHY is not None, reason=f"needs a GPU: {GPU_WHY}")


def test_grouped_picks_the_kernel(monkeypatch):
    """The decode product for n = 1 (token-slot pairs), the sorted product for blocks of 8. No GPU: the launches
    are recorded."""
    calls = []
    monkeypatch.setattr(mp, "decode", lambda *a, **k: calls.append("decode"))
    monkeypatch.setattr(mp, "sorted_kernel", lambda q: lambda *a: calls.append("sorted"))
    args = dict(w0=0, w1=None, ebytes=1, slot_of=None, x=0, out0=0, out1=None, blk_expert=0, blk_rows=None,
                kdiv=8, S=8, n_blocks=8, rows=768, cols=2048)
    mp.grouped("Q4_K", 1, **args)
    mp.grouped("Q4_K", 8, **args)
    assert calls == ["decode", "sorted"]
    with pytest.raises(ValueError):
        mp.grouped("Q4_K", 2, **args)


# ---------------------------------------------------------------- on the GPU
@needs_gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "IQ4_XS"])
@pytest.mark.parametrize("T", [1, 5])
def test_gpu_decode_product_layer_matches_cpu(tmp_path_factory, qtype, T):
    """A tiny qwen3moe layer's experts (pairs path) against the CPU backend."""
    path = str(tmp_path_factory.mktemp("moe") / f"qwen3moe-{qtype}.gguf")
    synth("qwen3moe", "tiny", qtype, path, seed=3)
    check_layer_experts_match_cpu(path, T)


# ------------------------------------------------------------------------------------------------
# IQ3_XXS / IQ4_XS experts on the grouped MoE path: the grouped products serve them in decode (one
# launch a product, no host sync, so decode steps are graph-captured) and in short prefill (sorted
# blocks of 8). The kernels are checked on the host by tests/test_moe_kernels_emulated.py; the GPU
# tests below against the CPU backend.
class _Dev:
    """Stands in for a CuPy uint8 array: what the plan and graph checks read of it."""

    def __init__(self, ptr, size):
        self.data, self.size = type("Mem", (), {"ptr": ptr})(), size


def _experts_backend(qtype, ptr=1 << 20, gate_qtype=None):
    from lite.backends.cuda_moe import CUDAExperts, _Weight
    from lite.kernels import quant_info
    info = quant_info(qtype)
    be = CUDAExperts()
    be.cp, be.host_experts = None, None
    shapes = {"gate": (8, 768, 2048), "up": (8, 768, 2048), "down": (8, 2048, 768)}
    be.w = {f"blk.0.ffn_{n}_exps.weight": _Weight(n, gate_qtype if gate_qtype and n == "gate" else qtype, s,
                                                  _Dev(ptr, 8 * 768 * 2048 // info.block_elems * info.type_size))
            for n, s in shapes.items()}
    return be


def test_iq_experts_take_the_fused_grouped_path():
    """IQ3_XXS / IQ4_XS experts resident on the GPU: one launch a product in decode (pairs, no
    host sync), so decode graphs are captured; types without a product struct still fall back."""
    for qtype in ("IQ3_XXS", "IQ4_XS", "Q4_K"):
        be = _experts_backend(qtype)
        assert be.moe_graph_safe(), qtype
        ws = [be.w[f"blk.0.ffn_{n}_exps.weight"] for n in ("gate", "up", "down")]
        for T in (1, 8):
            plan = be.moe_plan(np.zeros((T, 2), np.int32), ws)
            assert plan["path"] == "pairs" and plan["n_blocks"] == 2 * T, qtype
    assert not _experts_backend("IQ3_XXS", ptr=(1 << 20) + 1).moe_graph_safe()     # 16-bit loads
    assert not _experts_backend("IQ4_XS", ptr=(1 << 20) + 4).moe_graph_safe()      # 8-byte loads
    assert not _experts_backend("IQ2_XXS").moe_graph_safe()
    assert not _experts_backend("IQ3_XXS", gate_qtype="IQ2_XXS").moe_graph_safe()
    be = _experts_backend("IQ2_XXS")
    assert be.moe_plan(np.zeros((1, 2), np.int32), [be.w[f"blk.0.ffn_{n}_exps.weight"]
                                                     for n in ("gate", "up", "down")]) is None   # per expert


def test_product_sources_name_the_iq_structs():
    assert mp.sorted_name("IQ3_XXS") == "moe_sorted_product<Iq3XxsBlock, 8, 2>"
    assert mp.sorted_name("IQ4_XS") == "moe_sorted_product<Iq4XsBlock, 8, 2>"
    assert mp.decode_name("IQ4_XS", 768) == "moe_decode_product<Iq4XsBlock, 8, 3, 2>"
    from lite.kernels.dequant_iq import C_HELPERS
    for q in mp.IQ_TYPES:
        src = mp.sorted_source(q)
        assert f"struct {mp.struct(q)} " in src and "moe_sorted_product" in src and C_HELPERS in src
        assert C_HELPERS not in mp.sorted_source(q, host=True)     # the emulator tests bring host stand-ins



# ---------------------------------------------------------------- on the GPU
@needs_gpu
@pytest.mark.parametrize("qtype", ["IQ3_XXS", "IQ4_XS"])
@pytest.mark.parametrize("T", [1, 5, 12])        # pairs, pairs, sorted blocks
def test_gpu_grouped_iq_experts_match_cpu(tmp_path_factory, qtype, T):
    """Not yet run on a GPU (written without device time); the emulated twin is
    tests/test_moe_kernels_emulated.py."""
    path = str(tmp_path_factory.mktemp("moe") / f"qwen3moe-{qtype}.gguf")
    synth("qwen3moe", "tiny", qtype, path, seed=3)
    cpu, gpu = _cpu(path), _gpu(path)
    assert gpu.moe_graph_safe()
    rng = np.random.default_rng(T)
    h = rng.standard_normal((T, 256)).astype(np.float32)
    ids, w = cpu.moe_route(h, "blk.0.ffn_gate_inp.weight", 2, True)
    want = cpu.moe_experts(h, 0, ids, w, "silu")
    with gpu.activate():
        ws = [gpu.w[f"blk.0.ffn_{n}_exps.weight"] for n in ("gate", "up", "down")]
        assert gpu.moe_plan(gpu.cp.asarray(ids.astype(np.int32)), ws)["path"] == ("pairs" if T <= 8 else "sorted")
        got = gpu.moe_experts(gpu.cp.asarray(h), 0, ids, w, "silu").get()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())
