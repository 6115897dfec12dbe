"""The decode product `moe_decode_product` (kernels/moe_products.py) of the grouped MoE path: which
launch moe_products.grouped takes (CPU), and on the GPU that a layer's experts match the CPU
backend. The kernel's CUDA C is also checked on the host by tests/test_moe_decode_product_emulated.py.
"""
import numpy as np
import pytest

from kernel_blocks import random_blocks, reference
from lite.backends import cuda_unavailable_reason
from lite.kernels import moe_products as mp
from lite.kernels import quant_info
from lite.synth import synth
from test_experts import check_layer_experts_match_cpu

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
