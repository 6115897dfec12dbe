"""LITE_FOLD_NORM=1's wiring (lite/backends/cuda_norm.py): rms_norm of a few tokens returns a
NormedLater, which only the ops in TAKE use as such (the CUDA backend launches mvn there) and every
op in MATERIALIZE normalizes first. Checked on the CPU with a backend that plays the same game
(markers from rms_norm, TAKE ops and MATERIALIZE ops materializing, anything else failing on a
marker): logits must equal the plain backend's, and the norms of a decode token must reach the
products. The kernels themselves: tests/test_matvec_epilogue.py (emulator), test_cuda_backend.py (GPU)."""
import inspect

import numpy as np
import pytest

import lite.engine
from lite.backends.cpu import CPUBackend
from lite.backends.cuda_norm import FOLD_MAX_TOKENS, MATERIALIZE, TAKE, NormedLater
from lite.engine import Engine
from lite.synth import synth


class NormFoldingCPU(CPUBackend):
    taken = 0

    def _arr(self, h):
        if not isinstance(h, NormedLater):
            return h
        if h.done is None:
            h.done = CPUBackend.rms_norm(self, h.x, h.w, h.eps)     # w holds the name here
        return h.done

    def rms_norm(self, x, name, eps):
        x = self._arr(x)
        if x.ndim == 2 and x.shape[0] <= FOLD_MAX_TOKENS:
            return NormedLater(x, name, eps)
        return CPUBackend.rms_norm(self, x, name, eps)

    def linear_add(self, x, name, res):          # as the CUDA backend: residual adds folded too
        return self.linear(x, name) + self._arr(res)

    def linear_gated(self, x, names, act):
        gate, up = self.linear_many(x, names)
        return self.act_mul(gate, up, act)


def _taking(name):
    base = getattr(NormFoldingCPU, name)

    def op(self, *args, **kwargs):
        if any(isinstance(a, NormedLater) and a.done is None for a in args):
            NormFoldingCPU.taken += 1
        return base(self, *(self._arr(a) for a in args), **kwargs)
    return op


def _materializing(name):
    base = getattr(CPUBackend, name)

    def op(self, *args, **kwargs):
        return base(self, *(self._arr(a) for a in args), **kwargs)
    return op


for _n in TAKE:
    setattr(NormFoldingCPU, _n, _taking(_n))
for _n in MATERIALIZE:
    if _n != "rms_norm" and hasattr(CPUBackend, _n):
        setattr(NormFoldingCPU, _n, _materializing(_n))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3moe", "qwen2moe"])
def test_folded_norms_give_the_plain_results(tmp_path, monkeypatch, arch):
    path = str(tmp_path / f"{arch}.gguf")
    synth(arch, "tiny", "Q8_0", path, seed=5)
    ids = list(range(3, 20))
    plain = Engine(path, device="cpu", max_context=64)
    want = [plain.prefill(ids)] + [plain.decode_step(t) for t in (7, 8, 9)]
    monkeypatch.setattr(lite.engine, "resolve_backend", lambda device: ("cpu", NormFoldingCPU))
    NormFoldingCPU.taken = 0
    folded = Engine(path, device="cpu", max_context=64)
    got = [folded.prefill(ids)]
    assert NormFoldingCPU.taken == 1        # a chunk of 17 tokens: only the last one's output norm
    got += [folded.decode_step(t) for t in (7, 8, 9)]
    cfg = folded.cfg
    # each decode token: attn_norm (q/k/v) and output_norm always; ffn_norm where the FFN is
    # dense (an MoE block routes first, which materializes it)
    per_token = cfg.n_layer * (1 if cfg.is_moe else 2) + 1
    assert NormFoldingCPU.taken == 1 + 3 * per_token
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * np.abs(b).max())


def test_cuda_backend_materializes_where_it_does_not_take():
    """Every MATERIALIZE op of CUDABackend passes its inputs through _arr; every TAKE op goes
    through _product / _one_launch (source check: the CUDA backend cannot run here)."""
    from lite.backends.cuda import CUDABackend
    for name in MATERIALIZE:
        assert "_arr(" in inspect.getsource(getattr(CUDABackend, name)), name
    for name in TAKE:
        src = inspect.getsource(getattr(CUDABackend, name))
        assert "_product(" in src or "_one_launch(" in src or "self.linear(" in src, name
