"""lite serve's scheduler on the GPU (runs on the GPU machine; skips elsewhere): the batched step
(lite/engine/paged_cuda.py: paged KV in device memory, the rope-store and paged attention kernels,
prompt chunks through the backend's prefill attention) against the CPU.

- One batched step at a time, logits against the CPU's batched step on the same plans (prompt
  chunks beside decoding rows, a lone prompt token, one sequence alone), f16 and int8 KV.
- The scheduler: 8 concurrent requests of uneven lengths at temperature 0 give the tokens each
  gets alone (a fresh scheduler, one request at a time) and, sent again, the same tokens from
  the prefix cache; every token is a greedy choice of the CPU reference (teacher-forced logits);
  no slot or KV block is held afterwards.
- The decode steps replayed from CUDA graphs (lite/engine/paged_cuda.py DecodeGraphs, on by default, so every
  scheduler test above runs them) give the tokens of the same requests run eagerly.
GPU and CPU (and batched and alone, whose products may run on other kernels: fused matvecs up to
8 rows, cuBLAS past that) differ by float rounding, so two runs may part where two tokens' logits
nearly tie: there the test requires a near tie in the CPU's logits, and nothing after it.
Synthetic llama and qwen3 files (qwen3: the per-head q/k norms a one-row step defers); SmolLM2
too where ~/.cache/lite holds it (no download here)."""
import threading

import numpy as np
import pytest

from lite.backends import cuda_unavailable_reason
from lite.engine.engine import Engine
from lite.files.hub import KNOWN, cache_dir
from lite.engine.paged_cuda import graphable
from lite.engine.paged_kv import BlockPool, PagedKV
from lite.engine.sampling import SamplingParams
from lite.engine.scheduler import Scheduler
from lite.engine.sequence import GenParams
from lite.files.synth import synth

WHY = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"needs a GPU: {WHY}")
CTX, N_GEN, CHUNK = 256, 10, 48
LENGTHS = (3, 17, 33, 40, 9, 64, 1, 25)      # 8 requests; 64 > CHUNK: a prompt over two steps
TIE = 2e-2                                   # of the largest |logit|: what rounding may flip


def _smollm2():
    path = cache_dir() / "models" / KNOWN["smollm2"].filename
    if not path.exists():
        pytest.skip(f"SmolLM2 is not in {path.parent} (lite run smollm2 fetches it once)")
    return str(path)


@pytest.fixture(scope="module", params=["llama-Q4_K", "qwen3-Q6_K", "smollm2"])
def model(request, tmp_path_factory):
    if request.param == "smollm2":
        return _smollm2()
    arch, quant = request.param.split("-")
    path = tmp_path_factory.mktemp("synth") / f"{request.param}.gguf"
    synth(arch, "tiny", quant, str(path), seed=3)
    return str(path)


@pytest.fixture(scope="module")
def engines(model):
    """(GPU, CPU) engines on the same file; both keep a contiguous cache for teacher forcing."""
    return (Engine(model, device="cuda", max_context=CTX),
            Engine(model, device="cpu", max_context=CTX))


def _prompts(engine):
    rng = np.random.default_rng(7)
    top = min(engine.cfg.n_vocab, 480)
    return [[int(t) for t in rng.integers(3, top, n)] for n in LENGTHS]


# --- one batched step at a time ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["f16", "int8"])
def test_batched_steps_match_the_cpu(engines, kind):
    gpu, cpu = engines
    prompts = _prompts(gpu)[:5]
    B, n_blocks = 16, 64
    rng = np.random.default_rng(8)
    free = list(rng.permutation(n_blocks))             # block tables out of order
    tables = [[int(free.pop()) for _ in range(-(-(len(p) + 8) // B))] for p in prompts]
    pools = {}
    for name, eng in (("gpu", gpu), ("cpu", cpu)):
        pools[name] = []
        for st in eng.stages:
            with st.ops.activate():
                pools[name].append(BlockPool(eng.cfg, st.spec.layers, n_blocks, B, kind, st.ops.xp))
    tokens, done = [list(p) for p in prompts], [0] * len(prompts)
    # (sequence, rows) a step: 53 rows (cuBLAS products), prompt chunks beside decoding rows,
    # 8 and 7 rows (the fused matvecs' most) with a chunk among them, 5 decoding rows, one alone
    plans = [[(0, 3), (1, 17), (2, 33)], [(0, 1), (1, 1), (2, 1), (3, 20)],
             [(3, 20), (0, 1), (2, 1)], [(0, 1), (1, 1), (2, 1), (3, 1), (4, 4)],
             [(4, 5), (0, 1), (1, 1)], [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1)], [(1, 1)], [(2, 1)]]
    for plan in plans:
        ids = np.asarray([t for i, n in plan for t in tokens[i][done[i]:done[i] + n]], np.int32)
        starts, counts = [done[i] for i, _ in plan], [n for _, n in plan]
        got = {}
        for name, eng in (("gpu", gpu), ("cpu", cpu)):
            x = ids
            for st, pool in zip(eng.stages, pools[name]):
                x = st.forward_batch(x, starts, counts, [PagedKV(pool, tables[i], CTX) for i, _ in plan])
            got[name] = x
        want = got["cpu"]
        tol = 1e-2 if kind == "f16" else 2e-2
        np.testing.assert_allclose(got["gpu"], want, rtol=tol, atol=tol * np.abs(want).max(),
                                   err_msg=f"plan {plan}")
        for j, (i, n) in enumerate(plan):
            done[i] += n
            if done[i] == len(tokens[i]):
                tokens[i].append(int(np.argmax(want[j])))


# --- the scheduler: 8 concurrent requests -----------------------------------------------------

def _serve(engine, prompts, together, sched=None, graphs=True):
    """Greedy tokens of each prompt through a Scheduler (a fresh one unless given; graphs: its
    decode graphs): all submitted at once, or one after another. Returns (tokens per prompt,
    cached tokens per prompt, metrics)."""
    own = sched is None
    sched = sched or Scheduler(engine, n_slots=len(prompts), chunk=CHUNK, graphs=graphs).start()
    params = GenParams(max_tokens=N_GEN, sampling=SamplingParams.greedy())
    try:
        runs = []

        def submit(p):
            done, final = threading.Event(), {}

            def emit(ev):
                if "finish" in ev or "error" in ev:
                    final.update(ev)
                    done.set()
            runs.append((sched.submit(p, params, emit), done, final))
            if not together:
                assert done.wait(120), "a request alone did not finish in 120 s"
        for p in prompts:
            submit(p)
        for seq, done, final in runs:
            assert done.wait(120), "a request did not finish in 120 s"
            assert "error" not in final, final["error"]
        m = sched.metrics()
    finally:
        if own:
            sched.stop()
    toks = [seq.tokens[seq.n_prompt:] for seq, _, _ in runs]
    cached = [final["usage"]["prompt_tokens_details"]["cached_tokens"] for _, _, final in runs]
    return toks, cached, m


def _cpu_logits(cpu, prompt, toks):
    """The CPU's logits for each generated position and the one after (teacher forcing)."""
    cpu.cached_ids = []
    return cpu.prefill(prompt + toks, all_logits=True)[len(prompt) - 1:]


EOG = -1          # where a run stopped at an end-of-generation token (the scheduler sends none)


def _ended(toks):
    return list(toks) + ([EOG] if len(toks) < N_GEN else [])


def _logit(lg, t, eog_ids):
    return max(float(lg[e]) for e in eog_ids) if t == EOG else float(lg[t])


def _near_tie(lg, a, b, eog_ids):
    return abs(_logit(lg, a, eog_ids) - _logit(lg, b, eog_ids)) <= TIE * float(np.abs(lg).max())


def _check_greedy(logits, toks, eog_ids, what):
    """Every token (and an early stop) is the CPU's greedy choice, up to a near tie."""
    for d, t in enumerate(_ended(toks)):
        best = int(np.argmax(logits[d]))
        assert _near_tie(logits[d], t, best, eog_ids), \
            f"{what}: token {d} ({t}) is not a greedy choice of the CPU (its {best})"


def _same_or_tie(a, b, logits, eog_ids, what):
    """a == b, or equal up to a position where the CPU's logits (teacher-forced on a) nearly tie
    between the two; returns whether they are equal."""
    a, b = _ended(a), _ended(b)
    d = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if d is None:
        assert len(a) == len(b), what
        return True
    assert _near_tie(logits[d], a[d], b[d], eog_ids), \
        f"{what}: they part at token {d} ({a[d]} vs {b[d]}) where the CPU's logits do not tie"
    return False


def _greedy():
    from lite.engine.sampling import Sampler
    return Sampler(SamplingParams.greedy())


def test_concurrent_requests_get_their_alone_tokens(engines):
    gpu, cpu = engines
    prompts, eog = _prompts(gpu), cpu.tokenizer.eog_ids
    sched = Scheduler(gpu, n_slots=len(prompts), chunk=CHUNK).start()
    try:
        together, cached0, m = _serve(gpu, prompts, True, sched)
        assert m["slots_busy"] == 0 and m["kv_blocks_free"] == m["kv_blocks_total"], m
        again, cached, m = _serve(gpu, prompts, True, sched)         # from the prefix cache
        assert m["slots_busy"] == 0 and m["kv_blocks_free"] == m["kv_blocks_total"], m
    finally:
        sched.stop()
    assert cached0 == [0] * len(prompts)
    assert cached == [(n - 1) // 16 * 16 for n in LENGTHS]     # full blocks before the last token
    alone, _, m = _serve(gpu, prompts, False)
    assert m["kv_blocks_free"] == m["kv_blocks_total"]
    same = 0
    for i, p in enumerate(prompts):
        logits = _cpu_logits(cpu, p, together[i])
        _check_greedy(logits, together[i], eog, f"request {i} batched")
        same += _same_or_tie(together[i], alone[i], logits, eog, f"request {i} batched vs alone")
        _same_or_tie(together[i], again[i], logits, eog, f"request {i} batched vs cached")
        cpu.cached_ids = []
        want = list(cpu.generate(p, N_GEN, _greedy()))         # the CPU's own greedy run
        _same_or_tie(together[i], want, logits, eog, f"request {i} GPU batched vs CPU")
    assert same >= len(prompts) // 2, f"only {same} of {len(prompts)} batched requests equal alone"


def test_graphed_decode_steps_give_the_eager_tokens(engines):
    """The same 8 requests with the decode graphs and without (Scheduler(graphs=False)): the same
    tokens, and the graphed run replayed graphs (smaller buckets as requests finish). Graphed
    and eager steps may round apart (the graph's attention splits the keys for the whole context,
    its products run on the bucket's padded row count), so a difference is allowed only where
    the CPU's logits nearly tie, and nothing after it."""
    gpu, cpu = engines
    prompts, eog = _prompts(gpu), cpu.tokenizer.eog_ids
    graphed, _, m = _serve(gpu, prompts, True, graphs=True)
    eager, _, m0 = _serve(gpu, prompts, True, graphs=False)
    assert m0["graph_replays"] == 0
    if all(graphable(st) for st in gpu.stages):
        assert m["graph_replays"] > 0, m
    assert m["kv_blocks_free"] == m["kv_blocks_total"] and m["slots_busy"] == 0, m
    same = 0
    for i, p in enumerate(prompts):
        logits = _cpu_logits(cpu, p, graphed[i])
        _check_greedy(logits, graphed[i], eog, f"request {i} graphed")
        same += _same_or_tie(graphed[i], eager[i], logits, eog, f"request {i} graphed vs eager")
    assert same >= len(prompts) - 1, f"only {same} of {len(prompts)} graphed requests equal eager"


def test_two_virtual_stages_serve_as_one(engines, model):
    """A GPU engine split in two stages on one device: the batched step crosses them like a chunk."""
    gpu, cpu = engines
    prompts, eog = _prompts(gpu)[:4], cpu.tokenizer.eog_ids
    two = Engine(model, device=gpu.device, max_context=CTX, layer_split=2, contiguous_kv=False)
    got, _, m = _serve(two, prompts, True)
    assert m["kv_blocks_free"] == m["kv_blocks_total"]
    if all(graphable(st) for st in two.stages):        # each stage replays its own graphs
        assert m["graph_replays"] > 0, m
    want, _, _ = _serve(gpu, prompts, True)
    for i, p in enumerate(prompts):
        logits = _cpu_logits(cpu, p, want[i])
        _same_or_tie(want[i], got[i], logits, eog, f"request {i}: one stage vs two")


def test_hybrid_sequences_batched_on_the_gpu():
    """A hybrid (the tiny Qwen3Next fixture): each sequence's recurrent states on the device, its
    attention layers through the batched step; batched tokens as alone and as the CPU's, no
    prefix reuse (a recurrent state cannot be rebuilt from KV blocks)."""
    from pathlib import Path
    path = Path(__file__).parent / "fixtures" / "qwen3next_tiny.gguf"
    if not path.exists():
        pytest.skip(f"no {path.name}")
    gpu = Engine(str(path), device="cuda", max_context=CTX, contiguous_kv=False)
    cpu = Engine(str(path), device="cpu", max_context=CTX)
    prompts, eog = [p for p, n in zip(_prompts(gpu), LENGTHS) if n in (40, 17, 64, 1)], cpu.tokenizer.eog_ids
    together, cached, m = _serve(gpu, prompts, True)
    assert cached == [0] * len(prompts) and m["kv_blocks_free"] == m["kv_blocks_total"], m
    alone, _, _ = _serve(gpu, prompts, False)
    for i, p in enumerate(prompts):
        logits = _cpu_logits(cpu, p, together[i])
        _check_greedy(logits, together[i], eog, f"hybrid request {i} batched")
        _same_or_tie(together[i], alone[i], logits, eog, f"hybrid request {i} batched vs alone")


def test_a_rows_logits_in_a_batch_stay_within_the_bound(engines):
    """docs/design.md's bound: a decoding row beside a prompt chunk of 64 rows (cuBLAS
    products) against the same row alone (fused matvecs)."""
    gpu, _ = engines
    prompts = _prompts(gpu)
    got = []
    for plan in ([(0, 1)], [(0, 1), (5, 64)]):
        pools = []
        for st in gpu.stages:
            with st.ops.activate():
                pools.append(BlockPool(gpu.cfg, st.spec.layers, 16, 16, "f16", st.ops.xp))
        tables = [list(range(8)), list(range(8, 16))]
        x = np.asarray(prompts[0][:-1], np.int32)
        for st, pool in zip(gpu.stages, pools):      # the first row's prompt, alone
            x = st.forward_batch(x, [0], [len(prompts[0]) - 1], [PagedKV(pool, tables[0], CTX)])
        x = np.asarray([prompts[0][-1]] + (prompts[5] if len(plan) > 1 else []), np.int32)
        for st, pool in zip(gpu.stages, pools):
            x = st.forward_batch(x, [len(prompts[0]) - 1, 0][:len(plan)], [n for _, n in plan],
                                 [PagedKV(pool, tables[j], CTX) for j in range(len(plan))])
        got.append(np.asarray(x[0]))
    assert np.abs(got[1] - got[0]).max() <= 1e-2 * np.abs(got[0]).max()
