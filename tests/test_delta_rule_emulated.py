"""The Gated DeltaNet's CUDA C (kernels/cuda/delta_rule.cu) compiled with g++ against
tests/cuda_c_emulator.py and run through its real wrappers (kernels/delta_rule.py; a stand-in
`cupy` hands them NumPy arrays), against the CPU backend's functions (lite/backends/cpu_recurrent.py
and the hybrid's ops of lite/backends/cpu.py). No GPU needed; skips without g++."""
import contextlib
import types

import numpy as np
import pytest

from cuda_c_emulator import available, emulated_kernels
from lite.backend_config import BackendConfig
from lite.backends.cpu import CPUBackend
from lite.backends.cpu_recurrent import causal_conv_silu, delta_rule_chunked, delta_rule_recurrent
from lite.backends.cuda import CUDABackend
from lite.backends.cuda_attention import CUDAAttention, NormLater, RopeLater
from lite.backends.cuda_attention import CUDARecurrent

pytestmark = pytest.mark.skipif(not available(), reason="needs g++ (C++20) to emulate CUDA C")


@pytest.fixture(scope="module")
def emulated_modules():
    """{name: module} of lite.kernels (delta_rule, small_ops, decode_attention) imported against
    the stand-in `cupy`; the real modules are put back afterwards."""
    with emulated_kernels("delta_rule", "small_ops", "decode_attention",
                          ascontiguousarray=np.ascontiguousarray) as mods:   # delta_rule's inputs
        yield mods


@pytest.fixture(scope="module")
def dr(emulated_modules):
    return emulated_modules["delta_rule"]


def delta_inputs(T, Hk, Hv, dk, dv, seed=0, decay=0.5):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)   # noqa: E731
    q = unit(rng.standard_normal((T, Hk, dk))).astype(np.float32)
    k = unit(rng.standard_normal((T, Hk, dk))).astype(np.float32)
    v = rng.standard_normal((T, Hv, dv)).astype(np.float32)
    g = -rng.exponential(decay, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0, 1, (T, Hv)).astype(np.float32)
    S = rng.standard_normal((Hv, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, S


def close(got, want, tol=2e-5):
    err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
    assert err < tol, err


# --- the delta rule ------------------------------------------------------------------------------
SHAPES = [(2, 4, 16, 8), (3, 6, 18, 48), (1, 2, 32, 40)]    # (Hk, Hv, dk, dv): GQA 2, 2 and 2


@pytest.mark.parametrize("T", [1, 37, 64, 150])
@pytest.mark.parametrize("Hk,Hv,dk,dv", SHAPES)
def test_chunked_matches_cpu(dr, T, Hk, Hv, dk, dv):
    """Output and state against the CPU's chunked form: one chunk, part of one, whole chunks and
    a ragged tail; dk not a multiple of the decode warps, dv over two column tiles (one partial)."""
    q, k, v, g, beta, S = delta_inputs(T, Hk, Hv, dk, dv, seed=T + dk)
    S_cpu, S_gpu = S.copy(), S.copy()
    want = delta_rule_chunked(q, k, v, g, beta, S_cpu, dk ** -0.5)
    got = dr.chunked(q, k, v, g, beta, S_gpu, dk ** -0.5, None)
    assert got.shape == (T, Hv, dv) and got.dtype == np.float32
    close(got, want)
    close(S_gpu, S_cpu)


@pytest.mark.parametrize("Hk,Hv,dk,dv", SHAPES[:2])
def test_chunked_carries_the_state_across_calls(dr, Hk, Hv, dk, dv):
    """Calls of 1, 37, 64 and 48 tokens on one state = the CPU's recurrence over all 150."""
    q, k, v, g, beta, S = delta_inputs(150, Hk, Hv, dk, dv, seed=5)
    S_cpu, S_gpu = S.copy(), S.copy()
    want = delta_rule_recurrent(q, k, v, g, beta, S_cpu, 0.25)
    outs, t = [], 0
    for n in (1, 37, 64, 48):
        step = dr.decode if n == 1 else dr.chunked
        outs.append(step(q[t:t + n], k[t:t + n], v[t:t + n], g[t:t + n], beta[t:t + n], S_gpu, 0.25, None))
        t += n
    close(np.concatenate(outs), want, 1e-4)
    close(S_gpu, S_cpu, 1e-4)


def test_chunked_survives_strong_decay(dr):
    """exp(G_i - G_j) above the diagonal overflows: the kernel must mask before it exponentiates."""
    q, k, v, g, beta, S = delta_inputs(100, 2, 4, 16, 8)
    g[:] = -30.0
    S_cpu, S_gpu = S.copy(), S.copy()
    want = delta_rule_chunked(q, k, v, g, beta, S_cpu, 0.25)
    got = dr.chunked(q, k, v, g, beta, S_gpu, 0.25, None)
    assert np.isfinite(got).all() and np.isfinite(S_gpu).all()
    close(got, want)
    close(S_gpu, S_cpu)


@pytest.mark.parametrize("Hk,Hv,dk,dv", SHAPES)
def test_decode_steps_match_the_recurrence(dr, Hk, Hv, dk, dv):
    """Eight tokens one at a time on one state, against the CPU's recurrence."""
    q, k, v, g, beta, S = delta_inputs(8, Hk, Hv, dk, dv, seed=dv)
    S_cpu, S_gpu = S.copy(), S.copy()
    want = delta_rule_recurrent(q, k, v, g, beta, S_cpu, 0.3)
    got = np.concatenate([dr.decode(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1],
                                    S_gpu, 0.3, None) for t in range(8)])
    close(got, want)
    close(S_gpu, S_cpu)


def test_shapes_are_checked(dr):
    q, k, v, g, beta, S = delta_inputs(4, 2, 4, 16, 8)
    with pytest.raises(ValueError, match="delta rule"):
        dr.chunked(q, k, v, g, beta, S[:3].copy(), 0.25, None)
    with pytest.raises(ValueError, match="one token"):
        dr.decode(q, k, v, g, beta, S, 0.25, None)
    with pytest.raises(ValueError, match="contiguous"):
        dr.chunked(q, k, v, g, beta, np.asfortranarray(S), 0.25, None)


# --- the conv, the norms, the gates --------------------------------------------------------------
@pytest.mark.parametrize("K", [4, 2])
def test_conv_silu_carries_its_window(dr, K):
    """Chunks of 1, 2, 8 and 9 rows (rows fewer than the window, and more) = the CPU's conv over
    all 20 from the same window, which ends as the CPU's; 100 channels: a partial warp."""
    rng = np.random.default_rng(K)
    C = 100
    x = rng.standard_normal((20, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    start = rng.standard_normal((K - 1, C)).astype(np.float32)
    cpu_state, gpu_state = start.copy(), start.copy()
    want = causal_conv_silu(x, w, cpu_state)
    parts, t = [], 0
    for n in (1, 2, 8, 9):
        parts.append(dr.conv_silu(x[t:t + n], w, gpu_state, None))
        t += n
    close(np.concatenate(parts), want, 1e-6)
    np.testing.assert_array_equal(gpu_state, cpu_state)


def test_l2_norm_of_a_strided_view(dr):
    """q as the model slices it: a column range of the conv's output, split into heads."""
    rng = np.random.default_rng(2)
    c = rng.standard_normal((5, 3 * 40)).astype(np.float32)
    x = c[:, :80].reshape(5, 2, 40)
    got = dr.l2_norm(x, 1e-6, None)
    close(got, CPUBackend.l2_norm(None, x, 1e-6), 1e-6)
    assert got.shape == (5, 2, 40)


def test_gates_match_cpu(dr):
    rng = np.random.default_rng(3)
    T, Hv = 7, 6
    b = rng.standard_normal((T, Hv)).astype(np.float32) * 4
    a = rng.standard_normal((T, Hv)).astype(np.float32) * 30      # softplus far out on both sides
    cpu = types.SimpleNamespace(w={"A": -np.exp(rng.standard_normal(Hv)).astype(np.float32),
                                   "dt": rng.standard_normal(Hv).astype(np.float32)})
    g_want, beta_want = CPUBackend.delta_gates(cpu, b, a, "A", "dt")
    g, beta = dr.gates(b, a, cpu.w["A"], cpu.w["dt"], None)
    close(g, g_want, 1e-6)
    close(beta, beta_want, 1e-6)
    assert (g <= 0).all()


def test_sigmoid_mul_matches_cpu(dr):
    rng = np.random.default_rng(4)
    x, gate = rng.standard_normal((2, 3, 50)).astype(np.float32) * 5
    close(dr.sigmoid_mul(x, gate, None), CPUBackend.sigmoid_mul(None, x, gate), 1e-6)


# --- the whole qwen3next forward through the CUDA backend's own op code --------------------------
class EmulatedGPUOps(CUDARecurrent, CUDAAttention):
    """The fixture model's forward with the CUDA backend's code for what differs on the GPU: its
    rms_norm (with the decode token's per-head norm left for RoPE: NormLater), RoPE (RopeLater for
    one token), one-token attention (rope_kv_store and the decode kernel), the hybrid's ops
    (CUDARecurrent), all on the emulated CUDA C; products, experts and prefill attention from the
    CPU backend (cuBLAS and Numba kernels have no emulation here)."""
    rms_norm = CUDABackend.rms_norm

    def __init__(self, cpu, mods):
        self.cpu, self.cp, self.xp, self.pdl = cpu, np, np, False
        self.small_ops, self.decode_attn = mods["small_ops"], mods["decode_attention"]
        self.config, self.stream = BackendConfig(), contextlib.nullcontext()
        self.pos_dev, self.attn_counters = np.zeros(1, np.int64), self.decode_attn.new_counters(64)
        self.w = {n: types.SimpleNamespace(data=a, qtype="F32", shape=a.shape) for n, a in cpu.w.items()}

    def __getattr__(self, name):
        if name == "cpu":
            raise AttributeError(name)
        return getattr(self.cpu, name)

    def as_array(self, h):
        return h

    def norm_out_launch(self, x, name, eps):
        return None

    def begin(self, pos0, n_tokens):
        if n_tokens == 1:
            self.pos_dev[0] = pos0

    def attention(self, kv, il, q, k, v, pos0, scale, window=0):
        if q.shape[0] == 1:
            return CUDAAttention.attention(self, kv, il, q, k, v, pos0, scale, window)
        assert not isinstance(q, (RopeLater, NormLater))
        return CPUBackend.attention(self.cpu, kv, il, q, k, v, pos0, scale, window)


def _forward(ops, cfg, kv, ids, pos0):
    """All positions' logits of ids at pos0 (a stage's forward, every layer)."""
    from lite.models import qwen3next
    ops.begin(pos0, len(ids))
    x = ops.embed(np.asarray(ids))
    for il in range(cfg.n_layer):
        x = qwen3next.forward_layer(ops, cfg, il, x, kv, pos0)
    return ops.output(ops.rms_norm(x, "output_norm.weight", cfg.rms_eps))


def test_qwen3next_forward_on_the_cuda_ops_matches_cpu(emulated_modules):
    """The fixture prompt in chunks of 1, 37, 64 and 48 (the first one token: the decode kernels),
    then six greedy decode steps: the logits within 1e-3 of the largest, the tokens equal."""
    from lite.files.config import ModelConfig
    from lite.files.gguf_file import GGUFFile
    from lite.engine.kv_cache import KVCache
    from make_qwen3next_fixture import GGUF_PATH, REF_PATH
    gguf = GGUFFile(GGUF_PATH)
    cfg = ModelConfig.from_gguf(gguf.metadata)
    cpu = CPUBackend(gguf, list(gguf.tensors))
    gpu = EmulatedGPUOps(cpu, emulated_modules)
    ids = [int(i) for i in np.load(REF_PATH)["ids"]]
    runs = {}
    for name, ops in (("cpu", cpu), ("gpu", gpu)):
        kv = KVCache(cfg, range(cfg.n_layer), 256, "f16", np)
        rows, t = [], 0
        for n in (1, 37, 64, 48):
            rows.append(_forward(ops, cfg, kv, ids[t:t + n], t))
            t += n
        for _ in range(6):
            tok = int(np.argmax(rows[-1][-1]))
            rows.append(_forward(ops, cfg, kv, [tok], t))
            t += 1
        assert isinstance(kv.recurrent.ssm[0], np.ndarray) and kv.recurrent.at() == t
        runs[name] = np.concatenate(rows)
    want, got = runs["cpu"], runs["gpu"]
    assert np.abs(got - want).max() < 1e-3 * np.abs(want).max()
    assert (got[-7:].argmax(-1) == want[-7:].argmax(-1)).all()
