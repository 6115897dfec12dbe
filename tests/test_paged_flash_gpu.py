"""The flash prefill attention over the paged KV pool on the GPU (runs on the GPU machine; skips
elsewhere; the same kernel runs on the CPU under the emulator in tests/test_paged_flash_emulated.py).

- The kernel (kernels/flash_attention.py paged_prefill) on the emulated test's cases: several
  sequences' chunks in one launch, shuffled block tables, partial last blocks, GQA, windows, f16
  and int8 pages, head dims 64, 128 and 256, against float64 and against the contiguous kernel on
  each chunk's gathered copy.
- lite serve's batched step (lite/engine/paged_cuda.py CUDABatchOps) with BackendConfig.paged_flash: the
  steps' logits, with prompt chunks beside decoding rows, are those of the gather path (the same
  engine's file with paged_flash off), and the chunks did go through the paged kernel (one launch
  a layer); synthetic llama (head dim 64) and gemma3 (256, sliding windows, with
  flash_attention_256)."""
import numpy as np
import pytest

from lite.backend_config import BackendConfig
from lite.backends import cuda_unavailable_reason
from lite.engine.engine import Engine
from lite.engine.paged_kv import BlockPool, PagedKV
from lite.files.synth import synth
from test_paged_flash_emulated import CASES, case_id, run

WHY = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"needs a GPU: {WHY}")
CTX = 256


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_paged_kernel_on_the_gpu(case):
    import cupy as cp
    from lite.kernels import flash_attention
    run(flash_attention, *case, gpu=(cp, cp.cuda.Stream.null))


@pytest.fixture(scope="module", params=["llama-Q4_K", "gemma3-Q4_K"])
def engines(request, tmp_path_factory):
    """{paged_flash: GPU engine} on one synthetic file (head dim 256 through flash in both)."""
    arch, quant = request.param.split("-")
    path = tmp_path_factory.mktemp("synth") / f"{request.param}.gguf"
    synth(arch, "tiny", quant, str(path), seed=3)
    return {on: Engine(str(path), device="cuda", max_context=CTX, contiguous_kv=False,
                       config=BackendConfig(paged_flash=on, flash_attention_256=True))
            for on in (False, True)}


@pytest.mark.parametrize("kind", ["f16", "int8"])
def test_steps_through_the_paged_kernel_match_the_gather_path(engines, kind, monkeypatch):
    from lite.kernels import flash_attention
    launches = []
    paged = flash_attention.paged_prefill
    monkeypatch.setattr(flash_attention, "paged_prefill",
                        lambda *a, **k: launches.append(1) or paged(*a, **k))
    cfg = engines[False].cfg
    rng = np.random.default_rng(8)
    B, n_blocks = 16, 64
    prompts = [[int(t) for t in rng.integers(3, 480, n)] for n in (3, 17, 40, 64, 9)]
    free = list(rng.permutation(n_blocks))             # block tables out of order
    tables = [[int(free.pop()) for _ in range(-(-(len(p) + 4) // B))] for p in prompts]
    pools = {}
    for on, eng in engines.items():
        pools[on] = []
        for st in eng.stages:
            with st.ops.activate():
                pools[on].append(BlockPool(cfg, st.spec.layers, n_blocks, B, kind, st.ops.xp))
    tokens, done = [p + [5, 6, 7] for p in prompts], [0] * len(prompts)
    # (sequence, rows) a step: three prompts at once, then chunks after a cached prefix beside
    # decoding rows (past gemma3's window of 16), then a lone chunk
    plans = [[(0, 3), (1, 17), (2, 24)], [(0, 1), (2, 16), (3, 40), (1, 1)],
             [(3, 24), (4, 9), (0, 1)], [(4, 1), (1, 1)]]
    for plan in plans:
        ids = np.asarray([t for i, n in plan for t in tokens[i][done[i]:done[i] + n]], np.int32)
        starts, counts = [done[i] for i, _ in plan], [n for _, n in plan]
        got = {}
        for on, eng in engines.items():
            del launches[:]
            x = ids
            for st, pool in zip(eng.stages, pools[on]):
                x = st.forward_batch(x, starts, counts, [PagedKV(pool, tables[i], CTX) for i, _ in plan])
            got[on] = x
            chunked = any(n > 1 for _, n in plan)
            assert len(launches) == (cfg.n_layer if on and chunked else 0)
        want = got[False]
        np.testing.assert_allclose(got[True], want, rtol=1e-3, atol=1e-3 * np.abs(want).max(),
                                   err_msg=f"plan {plan}")
        for i, n in plan:
            done[i] += n
