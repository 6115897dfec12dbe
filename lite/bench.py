"""`lite bench MODEL`: prefill and decode speed, in llama-bench's table layout.

Every prompt starts with a unique nonce, so the prefix cache cannot serve it and the figure is
prefill, not the cache. One warm-up run, then the median of the repetitions.
"""
import statistics
import time

import numpy as np

from lite.chain.chunking import as_sizes, describe_schedule
from lite.engine.engine import Engine
from lite.engine.sampling import Sampler, SamplingParams


def _prompt(engine, n_tokens, nonce):
    """n_tokens ids: BOS-free random ids from a fixed generator, made unique by the nonce."""
    rng = np.random.default_rng(nonce)
    hi = min(engine.cfg.n_vocab, 32000)
    return [int(x) for x in rng.integers(100, hi, size=n_tokens)]


def bench_model(path, prompt_lens, n_gen, repetitions=3, timeline=None, counters=False, **engine_kw):
    """Rows of prefill (ppN) and decode (tgN @ N) tokens/s. With timeline (a path), the stage
    timeline of the last prefill is printed to stderr and written there as a Chrome trace.
    prefill_chunk may be a list (auto, 1024, ...): one model load, rows for each chunk setting."""
    need = max(prompt_lens) + n_gen
    if engine_kw.get("max_context") is None:
        engine_kw["max_context"] = need
    chunks = engine_kw.pop("prefill_chunk", None)
    chunks = chunks if isinstance(chunks, list) else [chunks]
    engine = Engine(path, device_times=bool(timeline), prefill_chunk=chunks[0], **engine_kw)
    rows = []
    for chunk in chunks:
        engine.chunk = chunk or engine.chunk
        rows += _bench_rows(engine, prompt_lens, n_gen, repetitions, nonce0=1 + len(rows) * 1000)
    stats = engine.expert_stats() if counters else None
    if stats:                # summed over every run, the warm-ups included
        import sys
        print("experts: " + ", ".join(f"{k} {v}" for k, v in stats.items()), file=sys.stderr)
        for r in rows:
            r["experts"] = stats
    if timeline:
        import sys
        tl = engine.chain.timeline
        print(tl.format(), file=sys.stderr)
        tl.to_chrome_trace(timeline)
    return rows


def _bench_rows(engine, prompt_lens, n_gen, repetitions, nonce0):
    greedy = Sampler(SamplingParams.greedy())
    rows = []
    nonce = nonce0
    for n in prompt_lens:
        pp, tg = [], []
        for rep in range(repetitions + 1):          # the first is the warm-up
            ids = _prompt(engine, n, nonce)
            nonce += 1
            t0 = time.perf_counter()
            logits = engine.prefill(ids)
            engine.stages[-1].ops.synchronize()
            t1 = time.perf_counter()
            tok = greedy(logits)
            for _ in range(n_gen):
                tok = greedy(engine.decode_step(tok))
            t2 = time.perf_counter()
            if rep:
                pp.append(n / (t1 - t0))
                if n_gen:
                    tg.append(n_gen / (t2 - t1))
        rows.append({"model": engine.gguf.path.rsplit("/", 1)[-1], "arch": engine.cfg.arch,
                     "device": engine.device, "kv": engine.stages[0].kv.kind,
                     "chunk": engine.last_chunk, "prefill": engine.chunk, "stages": len(engine.stages),
                     "schedule": describe_schedule(as_sizes(n, engine.last_chunk)),
                     "test": f"pp{n}", "tok_s": statistics.median(pp), "runs": pp,
                     "spread": (max(pp) - min(pp)) / statistics.median(pp) if pp else 0.0})
        if n_gen:
            rows.append({**rows[-1], "test": f"tg{n_gen} @ {n}", "tok_s": statistics.median(tg),
                         "runs": tg})
    return rows


def _chunk_label(row):
    """The chunk a prefill used; `auto 4096x2` (the schedule) when the cost model chose it."""
    if row.get("prefill") == "auto":
        return f"auto {row.get('schedule') or row['chunk']}"
    return str(row["chunk"])


def format_table(rows):
    w = max([9] + [len(_chunk_label(r)) for r in rows])
    head = (f"| {'model':36s} | {'device':6s} | {'kv':4s} | {'chunk':>{w}s} | {'stages':>6s} | "
            f"{'test':>12s} | {'t/s':>10s} |")
    sep = "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"
    out = [head, sep]
    for r in rows:
        out.append(f"| {r['model'][:36]:36s} | {r['device']:6s} | {r['kv']:4s} | "
                   f"{_chunk_label(r):>{w}s} | {r['stages']:6d} | {r['test']:>12s} | "
                   f"{r['tok_s']:10.2f} |")
    return "\n".join(out)
