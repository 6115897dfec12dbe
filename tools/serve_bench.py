"""Throughput of lite serve's scheduler (no HTTP): N concurrent requests, each a distinct random
prompt (so the prefix cache serves nothing) and a fixed number of generated tokens.

    python3 tools/serve_bench.py MODEL.gguf --device cuda --clients 1,8,16 --prompt 128 --gen 128

Prints, per client count, the median over --repeats of: generated tokens per second over all
requests (wall time from the first submit to the last finish), and each request's own decode rate.
"""
import argparse
import statistics
import threading
import time

import numpy as np

from lite.engine import Engine
from lite.sampling import SamplingParams
from lite.server.scheduler import Scheduler
from lite.server.sequence import GenParams


def one_round(sched, n, prompt_len, gen, rng, vocab):
    done, lock, rates, errors = threading.Event(), threading.Lock(), [], []
    left = [n]

    def emitter():
        def emit(ev):
            if "finish" in ev or "error" in ev:
                with lock:
                    if "error" in ev:
                        errors.append(ev["error"])
                    else:
                        t = ev["timings"]
                        rates.append(t["predicted_n"] / max(t["predicted_ms"], 1e-3) * 1e3)
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()
        return emit

    params = GenParams(max_tokens=gen, sampling=SamplingParams(temperature=0.0))
    t0 = time.perf_counter()
    for _ in range(n):
        sched.submit(rng.integers(100, vocab - 100, prompt_len).tolist(), params, emitter())
    if not done.wait(600):
        raise SystemExit("timed out")
    if errors:
        raise SystemExit(f"{len(errors)} requests failed: {errors[0]}")
    return n * gen / (time.perf_counter() - t0), statistics.median(rates)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--clients", default="1,8,16")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    counts = [int(c) for c in a.clients.split(",")]
    eng = Engine(a.model, device=a.device, max_context=a.ctx, contiguous_kv=False)
    rng = np.random.default_rng(0)
    print(f"| clients | generated tok/s (all) | per-request tok/s | prompt {a.prompt}, gen {a.gen}, "
          f"median of {a.repeats} |")
    print("|---:|---:|---:|---|")
    for n in counts:
        sched = Scheduler(eng, n_slots=n).start()
        try:
            one_round(sched, n, a.prompt, min(a.gen, 16), rng, eng.cfg.n_vocab)    # warm-up
            got = [one_round(sched, n, a.prompt, a.gen, rng, eng.cfg.n_vocab) for _ in range(a.repeats)]
        finally:
            sched.stop()
        print(f"| {n} | {statistics.median(g[0] for g in got):.1f} | "
              f"{statistics.median(g[1] for g in got):.1f} | |", flush=True)


if __name__ == "__main__":
    main()
