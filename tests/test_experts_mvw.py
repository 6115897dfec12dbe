"""The decode variant `moe_mvw` (kernels/moe_mvw.py, the default; LITE_MOE_MV=cta: moe_mv) of the grouped MoE
matvec: which launch grouped_mv takes (CPU), and on the GPU that it equals moe_mv within fp32
rounding on the Qwen3-30B-A3B expert shapes and that a layer's experts match the CPU backend.

The GPU tests passed on the H200 in session 3 (20 tests); the kernel's CUDA C is also checked on
the host by tests/test_moe_mvw_emulated.py.
"""
import numpy as np
import pytest

from kernel_blocks import random_blocks, reference
from lite.backends import cuda_unavailable_reason
from lite.kernels import moe_cuda as mk
from lite.kernels import moe_mvw
from lite.kernels import quant_info
from lite.synth import synth
from test_experts import check_layer_experts_match_cpu

GPU_WHY = cuda_unavailable_reason()
needs_gpu = pytest.mark.skipif(GPU_WHY is not None, reason=f"needs a GPU: {GPU_WHY}")


def test_switch_picks_the_kernel(monkeypatch):
    """Default (and LITE_MOE_MV=warp): moe_mvw for n = 1 only (sorted blocks of 8 keep moe_mv);
    cta: moe_mv. No GPU: the launches are recorded."""
    calls = []
    monkeypatch.setattr(moe_mvw, "launch", lambda *a, **k: calls.append("mvw"))
    monkeypatch.setattr(mk, "mv_kernel", lambda q, n: lambda *a: calls.append(f"mv{n}"))
    args = dict(w0=0, w1=None, ebytes=1, slot_of=None, x=0, out0=0, out1=None, blk_expert=0, blk_rows=None,
                kdiv=8, S=8, n_blocks=8, rows=768, cols=2048)
    for env, want in ((None, ["mvw", "mv8"]), ("cta", ["mv1", "mv8"]), ("warp", ["mvw", "mv8"])):
        if env is None:
            monkeypatch.delenv("LITE_MOE_MV", raising=False)
        else:
            monkeypatch.setenv("LITE_MOE_MV", env)
        calls.clear()
        mk.grouped_mv("Q4_K", 1, **args)
        mk.grouped_mv("Q4_K", 8, **args)
        assert calls == want, env


def test_config_overrides(monkeypatch):
    monkeypatch.setenv("LITE_MOE_MVW", "2048=16,2,4; 768=32,1,1")
    assert moe_mvw.config("Q4_K", 2048) == (16, 2, 4) and moe_mvw.config("Q4_K", 768) == (32, 1, 1)
    assert moe_mvw.config("Q4_K", 4096) == (32, 4, 2)          # widths not named: the default pick
    assert moe_mvw.rows_per_cta("Q4_K", 2048) == 32
    monkeypatch.setenv("LITE_MOE_MVW", "2048=12,2,4")
    with pytest.raises(ValueError, match="LITE_MOE_MVW"):
        moe_mvw.config("Q4_K", 2048)


# ---------------------------------------------------------------- on the GPU
def _run(monkeypatch, variant, *args, **kw):
    monkeypatch.setenv("LITE_MOE_MV", variant)
    mk.grouped_mv(*args, **kw)


@needs_gpu
@pytest.mark.parametrize("qtype", mk.MV_TYPES)
@pytest.mark.parametrize("T", [1, 8])
def test_gpu_mvw_equals_moe_mv(monkeypatch, qtype, T):
    """30B-A3B shapes (gate/up 768 x 2048 in one launch, down 2048 x 768 by row), 4 experts, k = 4,
    experts from cache slots with one not resident: moe_mvw = moe_mv within fp32 rounding (they sum
    in different orders), and the skipped expert's rows untouched by both."""
    import cupy as cp
    rng = np.random.default_rng(T)
    E, k = 4, 4
    info = quant_info(qtype)
    out = {}
    for name, rows, cols in (("gu", 768, 2048), ("down", 2048, 768)):
        blocks = random_blocks(qtype, E * rows * cols // info.block_elems, rng)
        W = reference(blocks, qtype).astype(np.float64).reshape(E, rows, cols)
        slot_of = np.array([1, 0, -1, 2], np.int32)            # expert 2 not in this round
        eb = blocks.size // E
        slots = np.zeros(3 * eb, np.uint8)
        for e, s in enumerate(slot_of):
            if s >= 0:
                slots[s * eb:(s + 1) * eb] = blocks[e * eb:(e + 1) * eb]
        ids = np.stack([rng.permutation(E)[:k] for _ in range(T)]).astype(np.int32).reshape(-1)
        S = T * k
        x = rng.standard_normal((S if name == "down" else T, cols)).astype(np.float32)
        d = dict(w=cp.asarray(slots), x=cp.asarray(x), ids=cp.asarray(ids), slot_of=cp.asarray(slot_of))
        for variant in ("cta", "warp"):
            o0, o1 = cp.full((S, rows), np.nan, np.float32), cp.full((S, rows), np.nan, np.float32)
            two = name == "gu"
            _run(monkeypatch, variant, qtype, 1, d["w"], d["w"] if two else None, eb, d["slot_of"], d["x"], o0,
                 o1 if two else None, d["ids"], None, k, S, S, rows, cols, x_by_row=not two)
            cp.cuda.get_current_stream().synchronize()
            out[variant] = (o0.get(), o1.get() if two else None)
        for j in (0, 1) if name == "gu" else (0,):
            a, b = out["cta"][j], out["warp"][j]
            for i in range(S):
                e = ids[i]
                if slot_of[e] < 0:
                    assert np.isnan(a[i]).all() and np.isnan(b[i]).all()
                    continue
                xr = x[i if name == "down" else i // k]
                scale = np.abs(W[e]) @ np.abs(xr).astype(np.float64)
                assert np.all(np.abs(a[i].astype(np.float64) - b[i]) <= 2e-5 * scale + 1e-30), (name, j, i)


@needs_gpu
@pytest.mark.parametrize("qtype", ["Q4_K", "IQ4_XS"])
@pytest.mark.parametrize("T", [1, 5])
def test_gpu_mvw_layer_matches_cpu(monkeypatch, tmp_path_factory, qtype, T):
    """A tiny qwen3moe layer's experts with LITE_MOE_MV=warp (pairs path) against the CPU backend."""
    monkeypatch.setenv("LITE_MOE_MV", "warp")
    path = str(tmp_path_factory.mktemp("moe") / f"qwen3moe-{qtype}.gguf")
    synth("qwen3moe", "tiny", qtype, path, seed=3)
    check_layer_experts_match_cpu(path, T)
