"""The decode step's folds: BackendConfig.fold_norm's wiring (lite/backends/cuda_norm.py), the model code's
residual fusions (models/llama.py: linear_residual, fold_residuals), and [gate; up] stored with rows
alternating (lite/backends/cuda.py _interleave), and programmatic dependent launch (kernels/pdl.py).
Each part below keeps its file's docstring.

"""
import ctypes
import inspect
import sys
import numpy as np
import pytest
import lite.engine.engine
from lite.backends.cpu import CPUBackend
from lite.backends.cuda_norm import MATERIALIZE, TAKE, AddLater, ScaledLater, feeds_router
from lite.engine.engine import Engine
from lite.files.synth import synth
import types
from lite.backends.cuda_linear import CUDALinear
from lite.kernels import matvec_epilogue, pdl
from lite.kernels.matvec_epilogue import interleave_rows


# ------------------------------------------------------------------------------------------------
# BackendConfig.fold_norm's wiring (lite/backends/cuda_norm.py): for one token linear_add returns an
# AddLater; rms_norm of an AddLater launches it with the norm out and returns a ScaledLater, which
# only the ops in TAKE use as such (the CUDA backend's scale-in kernels) while every op in
# MATERIALIZE, and the end of a stage, turn lazy values into arrays. Checked on the CPU with a
# backend that plays the same game (anything else fails on a lazy value): logits must equal the plain
# backend's, and the norms of a decode token must reach the products. The kernels themselves:
# tests/test_matvec_epilogue.py (emulator), test_cuda_backend.py (GPU).
PARTS = 4           # sums of squares a norm-out launch leaves (the GPU: one a CTA)


class NormSplitCPU(CPUBackend):
    taken = 0

    def as_array(self, h):
        if isinstance(h, AddLater):
            if h.done is None:
                h.done = CPUBackend.linear(self, h.x, h.w) + h.res      # w holds the name here
            return h.done
        if isinstance(h, ScaledLater):
            if h.done is None:
                h.done = h.xg * h.scale[:, None]
            return h.done
        return h

    def linear_add(self, x, name, res):
        res = self.as_array(res)
        if x.shape[0] == 1:
            return AddLater(x, name, res)
        return CPUBackend.linear(self, x, name) + res

    def rms_norm(self, x, name, eps):
        if isinstance(x, AddLater) and x.done is None and not feeds_router(self.w, name):
            out = self.as_array(x)
            part = np.stack([np.square(p, dtype=np.float32).sum(1) for p in np.array_split(out, PARTS, 1)], 1)
            scale = 1 / np.sqrt(part.sum(1) / out.shape[1] + eps)         # the last CTA's
            return ScaledLater(out * self.w[name], scale.astype(np.float32))
        return CPUBackend.rms_norm(self, self.as_array(x), name, eps)

    def done(self, x):
        return self.as_array(x)

    def linear_gated(self, x, names, act):
        gate, up = self.linear_many(x, names)
        return self.act_mul(gate, up, act)


def _taking(name):
    base = getattr(NormSplitCPU, name)

    def op(self, *args, **kwargs):
        if any(isinstance(a, ScaledLater) and a.done is None for a in args):
            NormSplitCPU.taken += 1
        return base(self, *(self.as_array(a) for a in args), **kwargs)
    return op


def _materializing(name):
    base = getattr(CPUBackend, name)

    def op(self, *args, **kwargs):
        return base(self, *(self.as_array(a) for a in args), **kwargs)
    return op


for _n in TAKE:
    setattr(NormSplitCPU, _n, _taking(_n))
for _n in MATERIALIZE:
    if _n not in ("rms_norm", "linear_add", "done") and hasattr(CPUBackend, _n):
        setattr(NormSplitCPU, _n, _materializing(_n))


@pytest.mark.parametrize("arch,split", [("llama", None), ("llama", 2), ("qwen3", None),
                                        ("qwen3moe", None), ("qwen2moe", None), ("gemma3", None)])
def test_split_norms_give_the_plain_results(tmp_path, monkeypatch, arch, split):
    path = str(tmp_path / f"{arch}.gguf")
    synth(arch, "tiny", "Q8_0", path, seed=5)
    ids = list(range(3, 20))
    plain = Engine(path, device="cpu", max_context=64, layer_split=split)
    want = [plain.prefill(ids)] + [plain.decode_step(t) for t in (7, 8, 9)]
    monkeypatch.setattr(lite.engine.engine, "resolve_backend", lambda device: ("cpu", NormSplitCPU))
    NormSplitCPU.taken = 0
    folded = Engine(path, device="cpu", max_context=64, layer_split=split)
    got = [folded.prefill(ids)]
    assert NormSplitCPU.taken == 0          # a chunk of 17 tokens: no residual add is held back
    got += [folded.decode_step(t) for t in (7, 8, 9)]
    cfg = folded.cfg
    # a decode token of llama/qwen3: every norm after a linear_add, i.e. each layer's ffn_norm, the
    # next layer's attn_norm (not across a stage boundary) and the output norm; qwen3moe/qwen2moe:
    # none (ffn_norm feeds the router; the MoE block ends in a plain add); gemma3: none (its norms
    # follow plain adds and products, never a linear_add)
    per_token = {"llama": 2 * cfg.n_layer + 1 - (split or 1), "qwen3": 2 * cfg.n_layer,
                 "qwen3moe": 0, "qwen2moe": 0, "gemma3": 0}[arch]
    assert NormSplitCPU.taken == 3 * per_token
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_cuda_backend_materializes_where_it_does_not_take():
    """Every MATERIALIZE op of CUDABackend passes its inputs through as_array; every TAKE op goes
    through folded_product / _one_launch (source check: the CUDA backend cannot run here)."""
    from lite.backends.cuda import CUDABackend
    for name in MATERIALIZE:
        assert "as_array(" in inspect.getsource(getattr(CUDABackend, name)), name
    for name in TAKE:
        src = inspect.getsource(getattr(CUDABackend, name))
        assert "folded_product(" in src or "_one_launch(" in src or "self.linear(" in src, name


def test_a_router_norm_is_not_split():
    w = {"blk.3.ffn_gate_inp.weight": 0, "blk.3.ffn_norm.weight": 0, "blk.4.ffn_norm.weight": 0}
    assert feeds_router(w, "blk.3.ffn_norm.weight")
    assert not feeds_router(w, "blk.4.ffn_norm.weight") and not feeds_router(w, "blk.3.attn_norm.weight")


# ------------------------------------------------------------------------------------------------
# The model code's decode fusions (models/llama.py: linear_residual, fold_residuals, ffn_block's
# linear_gated): on a backend that offers linear_add / linear_gated (the CUDA one), a decode token
# takes them, and the results equal the plain ops'. Checked here with a CPU backend that implements
# the two ops by its own plain ones, so any wiring mistake (a residual added twice or dropped, gate
# and up swapped, prefill taking the decode path) shows as different logits.
class FoldingCPU(CPUBackend):
    calls = {"linear_add": 0, "linear_gated": 0}

    def linear_add(self, x, name, res):
        FoldingCPU.calls["linear_add"] += x.shape[0]
        return self.linear(x, name) + res

    def linear_gated(self, x, names, act):
        FoldingCPU.calls["linear_gated"] += x.shape[0]
        gate, up = self.linear_many(x, names)
        return self.act_mul(gate, up, act)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3moe"])
def test_decode_fusions_give_the_plain_results(tmp_path, monkeypatch, arch):
    path = str(tmp_path / f"{arch}.gguf")
    synth(arch, "tiny", "Q8_0", path, seed=4)
    ids = list(range(3, 20))
    plain = Engine(path, device="cpu", max_context=64)
    want = [plain.prefill(ids)] + [plain.decode_step(t) for t in (7, 8, 9)]
    monkeypatch.setattr(lite.engine.engine, "resolve_backend", lambda device: ("cpu", FoldingCPU))
    FoldingCPU.calls = {"linear_add": 0, "linear_gated": 0}
    folded = Engine(path, device="cpu", max_context=64)
    got = [folded.prefill(ids)]
    prefill_calls = dict(FoldingCPU.calls)
    got += [folded.decode_step(t) for t in (7, 8, 9)]
    n_layer = folded.cfg.n_layer
    # prefill keeps add_rms_norm (no residual folding); the gated product serves every FFN
    assert prefill_calls["linear_add"] == 0
    # each decode token: the attention output of every layer, and the down product of dense layers
    per_token = n_layer * (1 if folded.cfg.is_moe else 2)
    assert FoldingCPU.calls["linear_add"] == 3 * per_token
    if not folded.cfg.is_moe:
        assert FoldingCPU.calls["linear_gated"] == len(ids) * n_layer + 3 * n_layer
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


# ------------------------------------------------------------------------------------------------
# [gate; up] stored with rows alternating (lite/backends/cuda.py _interleave,
# kernels/matvec_epilogue.interleave_rows): a product over the stored rows, as prefill's GEMM runs
# it, splits back into the gate and up products in CUDALinear.linear_many. (The gated decode kernel
# over that layout: tests/test_matvec_epilogue.py; both end to end on the GPU: test_cuda_backend.)
@pytest.mark.parametrize("F", [1, 6, 13])
def test_linear_many_splits_interleaved_rows(F):
    rng = np.random.default_rng(F)
    gate, up = rng.standard_normal((F, 8)), rng.standard_normal((F, 8))
    stored = np.concatenate([gate, up])[interleave_rows(F)]
    assert sorted(interleave_rows(F)) == list(range(2 * F))
    be = CUDALinear()
    be.w = {}
    names = ("blk.0.ffn_gate.weight", "blk.0.ffn_up.weight")
    be.fused = {names: (types.SimpleNamespace(data=stored), [F, F], True)}
    be.folded_product = lambda x, w: x @ w.data.T
    x = rng.standard_normal((3, 8))
    g, u = be.linear_many(x, list(names))
    np.testing.assert_allclose(g, x @ gate.T)
    np.testing.assert_allclose(u, x @ up.T)


# --- -------------------------------------------------------------------------------------------
# kernels/pdl.py (BackendConfig.pdl, programmatic dependent launch; on by default on sm_90+): the launch
# structures as cuda.h lays them out, the kernel arguments as cuLaunchKernelEx takes them, and the
# launch itself against a stand-in driver. The kernels' PDL code is compiled only with LT_PDL.
def test_structures_match_cuda_h():
    # CUlaunchAttribute: int id, pad to 8, a 64-byte union; CUlaunchConfig: 7 uints, then the
    # stream, the attribute pointer and their count (64-bit pointers)
    assert ctypes.sizeof(pdl.LaunchAttribute) == 72 and pdl.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(pdl.LaunchConfig) == 56
    assert (pdl.LaunchConfig.hStream.offset, pdl.LaunchConfig.attrs.offset,
            pdl.LaunchConfig.numAttrs.offset) == (32, 40, 48)


def _device_array(ptr):
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))


def test_pack_passes_pointers_and_scalars_by_address():
    vals, ptrs = pdl.pack([_device_array(0x7f0012345600), np.int32(-3), np.float32(1.5), None,
                           np.int64(1 << 40), np.uint64(7), np.float64(1e6)])      # (RoPE's base)
    read = [ctypes.c_uint64, ctypes.c_int32, ctypes.c_float, ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint64,
            ctypes.c_double]
    got = [t.from_address(ptrs[i]).value for i, t in enumerate(read)]
    assert got == [0x7f0012345600, -3, 1.5, 0, 1 << 40, 7, 1e6]
    with pytest.raises(TypeError):
        pdl.pack([3])                           # a Python int: which C type is not known


def test_launch_sets_the_programmatic_attribute(monkeypatch):
    seen = {}

    def driver(cfg, func, params, extra):
        c = cfg._obj
        seen.update(grid=(c.gridDimX, c.gridDimY, c.gridDimZ), block=(c.blockDimX, c.blockDimY, c.blockDimZ),
                    stream=c.hStream, n=c.numAttrs, attr=(c.attrs[0].id, c.attrs[0].value[0]), func=func.value,
                    arg0=ctypes.c_int32.from_address(params[0]).value)
        return 0

    monkeypatch.setattr(pdl, "_driver", lambda: driver)
    pdl.launch(types.SimpleNamespace(ptr=0x1234), (5, 2), (128,), [np.int32(9)], 0xABC)
    assert seen == {"grid": (5, 2, 1), "block": (128, 1, 1), "stream": 0xABC, "n": 1,
                    "attr": (pdl.ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, 1), "func": 0x1234, "arg0": 9}
    # a RawKernel (what RawModule.get_function returns) holds the handle in its kernel's ptr
    pdl.launch(types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0x4321)), (1,), (1,), [np.int32(1)], 0)
    assert seen["func"] == 0x4321
    monkeypatch.setattr(pdl, "_driver", lambda: lambda *a: 1)
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx"):
        pdl.launch(types.SimpleNamespace(ptr=1), (1,), (1,), [], 0)


def test_kernels_take_the_pdl_code_only_when_asked(monkeypatch):
    assert "#define LT_PDL\n" not in matvec_epilogue.c_source()
    assert not pdl.resolve(False) and pdl.source_head(False) == ""
    assert pdl.resolve(None) == pdl._current_device_has_pdl()     # auto: compute capability 9.0+
    monkeypatch.setattr(pdl, "_current_device_has_pdl", lambda: False)
    assert not pdl.resolve(None) and pdl.resolve(True)
    # a GPU of compute capability 9.0 but no cuLaunchKernelEx in the driver: plain launches
    monkeypatch.undo()
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(pdl, "_has_pdl", lambda device: True)
    monkeypatch.setattr(pdl, "_driver_ok", lambda: False)
    assert not pdl.resolve(None)
    monkeypatch.setattr(pdl, "_driver_ok", lambda: True)
    assert pdl.resolve(None)
    src = matvec_epilogue.c_source(pdl.source_head(True))
    assert src.startswith("#define LT_PDL") and "griddepcontrol.wait" in src
    # the wait comes before the trigger: at most two kernels resident (the other order lost)
    assert src.index("griddepcontrol.wait") < src.index("griddepcontrol.launch_dependents")


def test_call_takes_the_plain_launch_unless_enabled(monkeypatch):
    calls = []
    func = types.SimpleNamespace(ptr=0x99)
    plain = lambda grid, block, args, shared_mem=0, stream=None: calls.append(("plain", grid, shared_mem))
    pdl.call(lambda *a, **k: plain(*a, **k), (3,), (64,), (), stream=None, shared_mem=128, pdl=False)
    assert calls == [("plain", (3,), 128)] and pdl.source_head(False) == ""
    monkeypatch.setattr(pdl, "launch", lambda f, g, b, a, s, shared_mem=0: calls.append(("pdl", g, shared_mem, s)))
    pdl.call(func, (3,), (64,), (), stream=types.SimpleNamespace(ptr=0x55), shared_mem=128, pdl=True)
    assert calls[-1] == ("pdl", (3,), 128, 0x55) and pdl.source_head(True) == "#define LT_PDL\n"


def test_decode_kernels_open_with_the_prologue():
    """Every decode attention kernel (the default, the tiled one for the head dims it lacks,
    RoPE + KV store) starts with PDL_PROLOGUE, which is empty unless LT_PDL: a PDL launch of them
    never reads the previous kernel's output early."""
    from lite.kernels.cuda_source import source
    for name in ("decode_attention.cu", "decode_attention_tiled.cu", "rope_kv_store.cu"):
        src = source(name)
        assert src.count('extern "C" __global__') == 2 == src.count("{ PDL_PROLOGUE(); ")
        assert "#define PDL_PROLOGUE() do { } while (0)" in src
