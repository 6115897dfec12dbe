"""The chunked delta rule on the tensor cores (kernels/cuda/delta_rule_mma.cu, BackendConfig.delta_rule_mma)
compiled with g++ against tests/cuda_c_emulator.py (its tf32 mma emulated from the warp's fragments)
and run through its real wrapper against the CPU backend's chunked form and recurrence
(lite/backends/cpu_recurrent.py); the model's forward with the switch on. On the GPU:
tests/test_delta_rule_mma_gpu.py. No GPU needed; skips without g++."""
import dataclasses

import numpy as np
import pytest

from cuda_c_emulator import available, emulated_kernels
from lite.backends.cpu_recurrent import delta_rule_chunked, delta_rule_recurrent
from test_delta_rule_emulated import EmulatedGPUOps, _forward, close, delta_inputs

pytestmark = pytest.mark.skipif(not available(), reason="needs g++ (C++20) to emulate CUDA C")

# tf32 keeps 11 significant bits (a relative rounding of 2^-11 a product input): the results are
# held to a few such roundings of the largest value; 3xTF32 to the fp32 kernel's 2e-5.
TF32_TOL = 4e-3
TOL = {False: TF32_TOL, True: 2e-5}


@pytest.fixture(scope="module")
def emulated_modules():
    with emulated_kernels("delta_rule", "delta_rule_mma", "small_ops", "decode_attention",
                          ascontiguousarray=np.ascontiguousarray) as mods:
        yield mods


@pytest.fixture(scope="module")
def drm(emulated_modules):
    return emulated_modules["delta_rule_mma"]


@pytest.mark.parametrize("T,Hk,Hv,dk,dv,split", [
    (150, 1, 2, 128, 128, False),   # qwen3next's head dims: two chunks and a partial one
    (150, 1, 1, 128, 128, True),
    (37, 2, 4, 32, 48, False),      # part of a chunk; dv over two column tiles, one partial
    (37, 2, 4, 32, 48, True),
    (100, 1, 1, 16, 16, False),     # the smallest head dims it takes
])
def test_mma_chunked_matches_cpu(drm, T, Hk, Hv, dk, dv, split):
    q, k, v, g, beta, S = delta_inputs(T, Hk, Hv, dk, dv, seed=T + dk)
    S_cpu, S_gpu = S.copy(), S.copy()
    want = delta_rule_chunked(q, k, v, g, beta, S_cpu, dk ** -0.5)
    got = drm.chunked(q, k, v, g, beta, S_gpu, dk ** -0.5, None, split=split)
    assert got.shape == (T, Hv, dv) and got.dtype == np.float32
    close(got, want, TOL[split])
    close(S_gpu, S_cpu, TOL[split])


def test_mma_rounds_to_tf32_unless_split(drm):
    """The products do round to tf32 (the emulated mma is in the path): the error is above fp32's
    and below tf32's bound; split takes it down to fp32's."""
    q, k, v, g, beta, S = delta_inputs(64, 1, 1, 32, 32, seed=9)
    want = delta_rule_chunked(q, k, v, g, beta, S.copy(), 0.2)
    err = {split: np.abs(drm.chunked(q, k, v, g, beta, S.copy(), 0.2, None, split=split) - want).max()
           / np.abs(want).max() for split in (False, True)}
    assert 1e-5 < err[False] < TF32_TOL and err[True] < 2e-6


@pytest.mark.parametrize("split", [False, True])
def test_mma_carries_the_state_across_calls(drm, split):
    """Calls of 100 and 70 tokens (each with a partial last chunk) on one state = the CPU's
    recurrence over all 170, at qwen3next's head dims."""
    q, k, v, g, beta, S = delta_inputs(170, 1, 1, 128, 128, seed=5)
    S_cpu, S_gpu = S.copy(), S.copy()
    want = delta_rule_recurrent(q, k, v, g, beta, S_cpu, 0.25)
    a, b = (slice(0, 100), slice(100, 170))
    outs = [drm.chunked(q[s], k[s], v[s], g[s], beta[s], S_gpu, 0.25, None, split) for s in (a, b)]
    close(np.concatenate(outs), want, 2 * TOL[split])
    close(S_gpu, S_cpu, 2 * TOL[split])


def test_mma_survives_strong_decay(drm):
    """exp(G_i - G_j) above the diagonal overflows: the kernel must mask before it exponentiates."""
    q, k, v, g, beta, S = delta_inputs(100, 1, 2, 16, 32)
    g[:] = -30.0
    S_cpu, S_gpu = S.copy(), S.copy()
    want = delta_rule_chunked(q, k, v, g, beta, S_cpu, 0.25)
    got = drm.chunked(q, k, v, g, beta, S_gpu, 0.25, None)
    assert np.isfinite(got).all() and np.isfinite(S_gpu).all()
    close(got, want, TF32_TOL)
    close(S_gpu, S_cpu, TF32_TOL)


def test_mma_shapes(drm):
    assert drm.supports(128, 128) and drm.supports(16, 48)
    assert not drm.supports(18, 48) and not drm.supports(32, 40) and not drm.supports(1024, 128)
    q, k, v, g, beta, S = delta_inputs(4, 1, 2, 18, 16)
    with pytest.raises(ValueError, match="head dims 18, 16"):
        drm.chunked(q, k, v, g, beta, S, 0.25, None)
    q, k, v, g, beta, S = delta_inputs(4, 1, 2, 16, 16)
    with pytest.raises(ValueError, match="contiguous"):
        drm.chunked(q, k, v, g, beta, np.asfortranarray(S), 0.25, None)


def test_qwen3next_forward_with_delta_rule_mma_matches_cpu(emulated_modules, monkeypatch, mode="tf32", tol=5e-3):
    """The fixture model (head dims 16) through the CUDA backend's op code with delta_rule_mma on:
    prompt chunks of 37, 64 and 48 take the tensor-core kernel (a counter says so), one token the
    decode kernel; with tf32 (the less precise mode) the logits within 5e-3 of the largest (the
    GPU test's whole budget is 1e-2; the fp32 kernel is held to 1e-3)."""
    import lite.kernels
    from lite.backend_config import BackendConfig
    from lite.backends.cpu import CPUBackend
    from lite.files.config import ModelConfig
    from lite.files.gguf_file import GGUFFile
    from lite.engine.kv_cache import KVCache
    from make_qwen3next_fixture import GGUF_PATH, REF_PATH
    drm = emulated_modules["delta_rule_mma"]
    calls = []
    monkeypatch.setattr(lite.kernels, "delta_rule", emulated_modules["delta_rule"], raising=False)
    monkeypatch.setattr(lite.kernels, "delta_rule_mma", drm, raising=False)
    monkeypatch.setattr(drm, "chunked", lambda *a, f=drm.chunked, **kw: calls.append(1) or f(*a, **kw))
    gguf = GGUFFile(GGUF_PATH)
    cfg = ModelConfig.from_gguf(gguf.metadata)
    cpu = CPUBackend(gguf, list(gguf.tensors))
    gpu = EmulatedGPUOps(cpu, emulated_modules)
    gpu.config = dataclasses.replace(BackendConfig(), delta_rule_mma=mode)
    ids = [int(i) for i in np.load(REF_PATH)["ids"]][:150]
    runs = {}
    for name, ops in (("cpu", cpu), ("gpu", gpu)):
        kv = KVCache(cfg, range(cfg.n_layer), 256, "f16", np)
        rows, t = [], 0
        for n in (1, 37, 64, 48):
            rows.append(_forward(ops, cfg, kv, ids[t:t + n], t))
            t += n
        runs[name] = np.concatenate(rows)
    assert len(calls) == 3 * sum(cfg.recurrent)
    want, got = runs["cpu"], runs["gpu"]
    assert np.abs(got - want).max() < tol * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).all()
