"""The chunked delta rule on the tensor cores (kernels/delta_rule_mma.py) on the GPU machine (skips
elsewhere with its reason): at qwen3next-80B's shape (T 8192, 16 key heads, 32 value heads, head
dims 128) against the fp32 CUDA-core kernel (kernels/delta_rule.chunked), output and state, from a
state carried in; and the CUDA backend's prefill with delta_rule_mma on against the CPU. In CI the
same C runs on the emulator: tests/test_delta_rule_mma_emulated.py. Timing:
`python3 -m lite.kernels.bench --delta-rule 8192` (printed, never asserted)."""
import numpy as np
import pytest

from lite.backends import cuda_unavailable_reason
from test_delta_rule_emulated import delta_inputs
from test_qwen3next import chunked_logits, engine, fixture, ref, rel_err  # noqa: F401  (fixtures)

GPU_WHY = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(GPU_WHY is not None, reason=f"needs a GPU: {GPU_WHY}")
TOL = {False: 4e-3, True: 5e-5}      # tf32, 3xtf32: relative to the largest value


def rel(got, want):
    return float(abs(got - want).max() / max(1.0, float(abs(want).max())))


@pytest.mark.parametrize("decay", [0.5, 0.02])     # strong decay, and a state that remembers long
@pytest.mark.parametrize("split", [False, True])
def test_mma_matches_the_fp32_kernel_at_qwen3next_shape(split, decay):
    import cupy
    from lite.kernels import delta_rule, delta_rule_mma
    T, Hk, Hv, dk, dv = 8192, 16, 32, 128, 128
    host = delta_inputs(T + 100, Hk, Hv, dk, dv, seed=3, decay=decay)
    q, k, v, g, beta, S = (cupy.asarray(a) for a in host)
    stream = cupy.cuda.Stream(non_blocking=True)
    S_ref, S_mma = S.copy(), S.copy()
    outs = {}
    for name, fn, state in (("fp32", delta_rule.chunked, S_ref),
                            ("mma", lambda *a: delta_rule_mma.chunked(*a, split=split), S_mma)):
        # 100 tokens first (a partial chunk), then T: the state carried between calls
        parts = [fn(q[s], k[s], v[s], g[s], beta[s], state, dk ** -0.5, stream)
                 for s in (slice(0, 100), slice(100, T + 100))]
        outs[name] = cupy.concatenate(parts)
    stream.synchronize()
    assert bool(cupy.isfinite(outs["mma"]).all()) and bool(cupy.isfinite(S_mma).all())
    assert rel(outs["mma"], outs["fp32"]) < TOL[split]
    assert rel(S_mma, S_ref) < TOL[split]


@pytest.mark.parametrize("mode", ["tf32", "3xtf32"])
def test_qwen3next_prefill_with_delta_rule_mma_matches_cpu(ref, mode):
    """The fixture prompt whole and in chunks of 37, 65 and 48 through the CUDA backend with
    delta_rule_mma: the logits within tests/test_qwen3next_gpu.py's 1e-2 of the CPU's."""
    from lite.backend_config import BackendConfig
    from test_qwen3next_gpu import GPU_TOL, gpu_engine
    ids = [int(i) for i in ref["ids"]]
    want = engine().prefill(ids, all_logits=True)
    config = BackendConfig(delta_rule_mma=mode)
    assert rel_err(gpu_engine(config=config).prefill(ids, all_logits=True), want) < GPU_TOL
    assert rel_err(chunked_logits(gpu_engine(config=config), ids, (37, 65, 48)), want) < GPU_TOL

