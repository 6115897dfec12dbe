"""The server's batched step on the CPU gives a row the same bytes whichever rows share its step:
the backend's row_invariant products (checked here against the installed BLAS, whose gemv and
small-matrix kernels sum in another order than its gemm), its attention (a row's bytes the same in
any chunk from any position, so a prompt served partly from the prefix cache gives its uncached
logits) and prompt chunks that end at multiples of the chunk size in the sequence's own positions,
however many prompts share the step's budget. tests/test_server.py checks the whole: seeded
requests under load, or from the prefix cache, give their lone texts. And a step of two stages is
a job of the engine's stage chain, with the bytes of the stages run one after the other."""
from types import SimpleNamespace

import numpy as np
import pytest

from lite.backends.cpu import CPUBackend
from lite.engine.paged_kv import BlockPool, PagedKV
from lite.chain.pipeline import StageError
from lite.engine.sampling import SamplingParams
from lite.engine.scheduler import Scheduler
from lite.engine.sequence import GenParams, Sequence
from lite.chain.timeline import Timeline

SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (64, 64), (8, 256), (3000, 64)]


def _ops(w):
    ops = CPUBackend.__new__(CPUBackend)
    ops.w = {"w": w}
    return ops


@pytest.mark.parametrize("shape", SHAPES)
def test_a_rows_product_is_the_same_in_any_batch(shape):
    rng = np.random.default_rng(sum(shape))
    w = rng.standard_normal(shape).astype(np.float32)
    rows = rng.standard_normal((70, shape[1])).astype(np.float32)
    ops = _ops(w).row_invariant
    alone = ops.linear(rows[:1], "w")[0]
    for T in (2, 3, 5, 7, 8, 9, 21, 33, 70):
        got = ops.linear(rows[:T], "w")
        for j in sorted({0, T // 2, T - 1}):
            x = rows[:T].copy()
            x[j] = rows[0]
            assert ops.linear(x, "w")[j].tobytes() == alone.tobytes(), (T, j)
        assert np.allclose(got, rows[:T] @ w.T, rtol=1e-4, atol=1e-3)


def test_plain_ops_keep_blas_products():
    ops = _ops(np.ones((4, 4), np.float32))
    assert not ops.pad_rows and ops.row_invariant.pad_rows and ops.row_invariant.w is ops.w


def _attention_rows(ops, chunks, q, k, v, window):
    """Every row's attention output when the positions run in these chunks, in order."""
    cfg = SimpleNamespace(n_head_kv=k.shape[1], head_dim=k.shape[2], v_head_dim=v.shape[2],
                          is_recurrent_layer=lambda il: False)
    n = q.shape[0]
    kv = PagedKV(BlockPool(cfg, [0], -(-n // 16), kind="f32"), list(range(-(-n // 16))), n)
    out, p = [], 0
    for c in chunks:
        out.append(ops.attention(kv, 0, q[p:p + c], k[p:p + c], v[p:p + c], p, 0.125, window))
        p += c
    assert p == n
    return np.concatenate(out)


@pytest.mark.parametrize("window", [0, 24])
def test_a_rows_attention_is_the_same_in_any_chunk(window):
    # one position at a time (decode), the whole prompt, a prefix-cache hit's tail after a cached
    # head, and uneven chunks all give each row the same bytes
    rng = np.random.default_rng(window)
    n, H, Hkv, D = 140, 9, 3, 64
    q = rng.standard_normal((n, H, D)).astype(np.float32)
    k = rng.standard_normal((n, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((n, Hkv, D)).astype(np.float32)
    ops = _ops(np.ones((1, 1), np.float32)).row_invariant
    alone = _attention_rows(ops, [1] * n, q, k, v, window)
    for chunks in ([n], [32, 11] + [1] * (n - 43), [64, 64, 12], [7] * 20, [100, 40]):
        assert _attention_rows(ops, chunks, q, k, v, window).tobytes() == alone.tobytes(), chunks
    # and it is the attention the plain ops compute in one chunk
    plain = _attention_rows(_ops(np.ones((1, 1), np.float32)), [n], q, k, v, window)
    assert np.allclose(alone, plain, rtol=1e-5, atol=1e-6)


def _plan(chunk, prompt_lengths, computed):
    sched = Scheduler.__new__(Scheduler)
    sched.chunk, sched.running = chunk, []
    for i, (n, done) in enumerate(zip(prompt_lengths, computed)):
        seq = Sequence(i, list(range(1, n + 1)), GenParams(sampling=SamplingParams.greedy()),
                       None, None)
        seq.n_computed = done
        sched.running.append(seq)
    return [(s.id, n) for s, n in sched._plan()]


def test_prompt_chunks_end_at_multiples_of_the_chunk():
    # alone, a 40-token prompt runs as 16 + 16 + 8; beside others it keeps those chunks, and a chunk
    # that does not fit the step's budget waits for the next step instead of being cut
    assert _plan(16, [40], [0]) == [(0, 16)]
    assert _plan(16, [5, 40], [0, 0]) == [(0, 5)]
    assert _plan(16, [5, 40, 9], [0, 0, 0]) == [(0, 5), (2, 9)]
    assert _plan(16, [40, 5], [16, 0]) == [(0, 16)]
    assert _plan(16, [40, 5], [32, 0]) == [(0, 8), (1, 5)]
    # a prefix-cache hit at 48 tokens: the chunk ends at 64, as the prompt's chunks alone do
    assert _plan(64, [200], [48]) == [(0, 16)]
    # decoding rows run beside the chunks and do not count against the budget
    assert _plan(16, [3, 40], [4, 0]) == [(0, 1), (1, 16)]


# --- a step through the stage chain ----------------------------------------------------------------

@pytest.fixture(scope="module")
def two_stages(tmp_path_factory):
    from lite.engine.engine import Engine
    from lite.files.synth import synth
    path = tmp_path_factory.mktemp("synth") / "llama-q8.gguf"
    synth("llama", "tiny", "Q8_0", str(path), seed=4)
    return Engine(str(path), device="cpu", max_context=64, contiguous_kv=False, layer_split=2)


def test_a_two_stage_step_is_a_job_of_the_stage_chain(two_stages, monkeypatch):
    """Steps of prompt chunks and decode rows on two CPU stages: each stage runs each step as a job
    of the engine's stage chain (the scheduler's timeline records stage 0, then 1, per step), the
    logits are the bytes of the stages' forward_batch called one after the other on pools of their
    own, and a stage's failure names the stage and the step."""
    e = two_stages
    timeline = Timeline()
    sched = Scheduler(e, n_slots=2, chunk=16, timeline=timeline)
    rng = np.random.default_rng(7)
    seqs = [SimpleNamespace(tokens=[int(t) for t in rng.integers(3, 400, 20)], n_computed=0,
                            blocks=table, recurrent=None) for table in ([5, 2, 7, 0], [1, 6, 3, 4])]
    pools = [BlockPool(e.cfg, st.spec.layers, sched.blocks.n_blocks, sched.blocks.block_size,
                       e.kv_kind) for st in e.stages]
    steps = [[(0, 12), (1, 5)], [(0, 1), (1, 1)], [(1, 3), (0, 1)], [(0, 1), (1, 1)]]
    for k, step in enumerate(steps):
        plan = [(seqs[i], n) for i, n in step]
        want = np.asarray([t for s, n in plan for t in s.tokens[s.n_computed:s.n_computed + n]],
                          np.int32)
        starts, counts = [s.n_computed for s, _ in plan], [n for _, n in plan]
        for st, pool in zip(e.stages, pools):
            want = st.forward_batch(want, starts, counts,
                                    [PagedKV(pool, s.blocks, sched.ctx) for s, _ in plan])
        got = sched._forward(plan, k, sched.timeline)
        assert got.shape == (len(plan), e.cfg.n_vocab) and np.array_equal(got, want), k
        for s, n in plan:
            s.n_computed += n
    in_time = sorted(timeline.events, key=lambda ev: ev.start)
    assert [(ev.stage, ev.chunk, ev.name) for ev in in_time] == [
        (si, k, "step") for k in range(len(steps)) for si in (0, 1)]

    def broken(*args):
        raise RuntimeError("no")
    monkeypatch.setattr(e.stages[1], "forward_batch", broken)
    with pytest.raises(StageError, match=r"stage 1 failed on step 4 \(2 rows of 2 sequences\)"):
        sched._forward([(s, 1) for s in seqs], 4)
