"""The server's batched step on the CPU gives a row the same bytes whichever rows share its step:
the backend's row_invariant products (checked here against the installed BLAS, whose gemv and
small-matrix kernels sum in another order than its gemm) and prompt chunks that end at multiples
of the chunk size in the sequence's own positions, however many prompts share the step's budget.
tests/test_server.py checks the whole: seeded requests under load give their lone texts."""
import numpy as np
import pytest

from lite.backends.cpu import CPUBackend
from lite.sampling import SamplingParams
from lite.server.scheduler import Scheduler
from lite.server.sequence import GenParams, Sequence

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
