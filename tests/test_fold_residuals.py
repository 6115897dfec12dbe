"""The model code's decode fusions (models/llama.py: linear_residual, fold_residuals, ffn_block's
linear_gated): on a backend that offers linear_add / linear_gated (the CUDA one), a decode token
takes them, and the results equal the plain ops'. Checked here with a CPU backend that implements
the two ops by its own plain ones, so any wiring mistake (a residual added twice or dropped, gate
and up swapped, prefill taking the decode path) shows as different logits."""
import numpy as np
import pytest

import lite.engine
from lite.backends.cpu import CPUBackend
from lite.engine import Engine
from lite.synth import synth


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
    monkeypatch.setattr(lite.engine, "resolve_backend", lambda device: ("cpu", FoldingCPU))
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
