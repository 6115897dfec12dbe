"""Where a decode step's time goes on the GPU.

    python3 tools/profile_decode.py MODEL.gguf [prompt_tokens] [KEY=VALUE,..]
graph replay alone against the whole step, the host's share, and each op replayed alone (its own
graph, launch overhead included); the last argument: BackendConfig settings, as `lite bench
--config`, e.g. graph_io=off.

    ncu --profile-from-start off --graph-profiling node --clock-control none \
        --metrics gpu__time_duration.sum --csv python3 tools/profile_decode.py --trace MODEL.gguf [n] [steps] [KEY=VALUE,..] > K.csv
    python3 tools/profile_decode.py --summary K.csv [steps] [graph replay us]
--trace: the decode step's kernels as they run inside the replayed CUDA graph, each kernel's own GPU
time: Nsight Compute (the device image has ncu, not nsys) times every kernel node of the captured
steps only (with the same settings as the first mode, e.g. hybrid_graphs=on for qwen3next's graphed
decode). --summary: per kernel name, the count a step and the GPU time a step; their sum against
the graph replay's time (the first mode's "GPU time per replay"): the rest is the gaps between
dependent kernels (launch latency, drain, ramp-up), which no kernel's speed removes.
"""
import csv
import sys
import time
from collections import defaultdict

import numpy as np

from lite.backend_config import BackendConfig
from lite.engine.engine import Engine
from lite.engine.sampling import Sampler, SamplingParams


def profile(path, n=512, settings=""):
    config = BackendConfig().with_settings(settings)
    e = Engine(path, device="cuda", max_context=n + 256, config=config)
    greedy = Sampler(SamplingParams.greedy())
    ids = [int(x) for x in np.random.default_rng(0).integers(100, 30000, n)]
    tok = greedy(e.prefill(ids))
    for _ in range(3):
        tok = greedy(e.decode_step(tok))           # warm-up and capture
    st = e.stages[0]
    ops = st.ops
    if st._graph is None:          # e.g. qwen3next without hybrid_graphs: nothing to replay
        sys.exit("profile_decode: the first stage's decode step is not a captured graph with these "
                 "settings (qwen3next needs hybrid_graphs=on)")
    reps = 50
    t0 = time.perf_counter()
    for _ in range(reps):
        tok = greedy(e.decode_step(tok))
    step = (time.perf_counter() - t0) / reps
    ops.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        ops.replay(st._graph)
    ops.synchronize()
    replay = (time.perf_counter() - t0) / reps
    # GPU time of one replay from events
    cp = ops.cp
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(ops.stream)
    for _ in range(reps):
        ops.replay(st._graph)
    b.record(ops.stream)
    b.synchronize()
    gpu = cp.cuda.get_elapsed_time(a, b) / 1e3 / reps
    nbytes = (sum(w.data.nbytes for w in ops.w.values())
              + sum(g[0].data.nbytes for g in ops.fused.values() if g[2]))   # (members deleted)
    print(f"decode step {step * 1e3:.2f} ms ({1 / step:.1f} tok/s); graph replay back to back "
          f"{replay * 1e3:.2f} ms; GPU time per replay {gpu * 1e3:.2f} ms; weights {nbytes / 1e9:.2f} GB "
          f"-> {nbytes / gpu / 1e9:.0f} GB/s")
    # GPU time of each op of one decode step: every op call is captured into a graph of its own
    # and replayed (a plain launch from Python would time the host, not the kernel)
    times, counts = defaultdict(float), defaultdict(int)
    # embed copies ids from the host: not capturable; a one-token rope only marks its input for
    # attention, which rotates q and k in the launch that stores the KV cache (no GPU work)
    # where the host's share goes: the step without sampling, the sampler alone
    t0 = time.perf_counter()
    for _ in range(reps):
        logits = e.decode_step(tok)
    bare = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        greedy(logits)
    sample = (time.perf_counter() - t0) / reps
    print(f"host: decode_step without sampling {bare * 1e3:.3f} ms (graph replay {replay * 1e3:.3f} ms, "
          f"so {max(bare - replay, 0) * 1e3:.3f} ms of input, output copy and Python); greedy sampler "
          f"{sample * 1e3:.3f} ms on {logits.size} logits")
    io = getattr(e.stages[-1].ops, "graph_io", None)
    print(f"host share per step (step without sampling - GPU time per replay): "
          f"{(bare - gpu) * 1e6:.1f} us; graph_io {'on' if io is not None else 'off'}"
          + (f" (pinned logits buffers held {io.pool.held}/{io.pool.size}, steps that copied "
             f"{io.copied_steps})" if io is not None else ""))
    for name in ("linear", "linear_many", "linear_add", "linear_gated", "rms_norm", "add_rms_norm",
                 "attention", "act_mul", "add", "output", "rope", "moe_route", "moe_experts",
                 "delta_step", "delta_gates", "conv_silu", "l2_norm", "delta_rule", "sigmoid_mul",
                 "add_sigmoid_gated"):
        f = getattr(ops, name, None)
        if f is None:
            continue

        def timed(*args, _f=f, _n=name, **kw):
            graph, r = ops.capture(lambda: _f(*args, **kw))
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(ops.stream)
            for _ in range(20):
                ops.replay(graph)
            b.record(ops.stream)
            b.synchronize()
            times[_n] += cp.cuda.get_elapsed_time(a, b) / 20
            counts[_n] += 1
            return r
        setattr(ops, name, timed)
    st.use_graphs = False
    e.decode_step(tok)
    total = sum(times.values())
    print(f"per-op GPU time of one step (each op replayed alone): {total:.3f} ms")
    for k in sorted(times, key=lambda k: -times[k]):
        print(f"  {k:12s} {counts[k]:4d} calls {times[k]:8.3f} ms  {times[k] / counts[k] * 1e3:7.1f} us/call")


def trace(path, n, steps, settings=""):
    import cupy
    config = BackendConfig().with_settings(settings)
    e = Engine(path, device="cuda", max_context=n + steps + 64, config=config)
    greedy = Sampler(SamplingParams.greedy())
    ids = [int(x) for x in np.random.default_rng(0).integers(100, 30000, n)]
    tok = greedy(e.prefill(ids))
    for _ in range(3):
        tok = greedy(e.decode_step(tok))           # warm-up and capture
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.profiler.start()
    for _ in range(steps):
        tok = greedy(e.decode_step(tok))
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.profiler.stop()


def short(name):
    name = name.split("(")[0]
    return name[:60]


def summary(csv_path, steps, replay_us=None):
    lines = open(csv_path).read().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = [r for r in csv.DictReader(lines[first:]) if r.get("Metric Name") == "gpu__time_duration.sum"]
    per, cnt = defaultdict(float), defaultdict(int)
    for r in rows:
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}[r["Metric Unit"]]
        k = short(r["Kernel Name"])
        per[k] += float(r["Metric Value"].replace(",", "")) * scale
        cnt[k] += 1
    busy = sum(per.values()) / steps
    print(f"{len(rows) / steps:.0f} kernels a step, their GPU time {busy:.1f} us a step"
          + (f"; graph replay {replay_us:.1f} us: {replay_us - busy:.1f} us of gaps "
             f"({(replay_us - busy) / (len(rows) / steps):.2f} us a kernel)" if replay_us else ""))
    for k in sorted(per, key=lambda k: -per[k]):
        print(f"  {per[k] / steps:8.1f} us  {cnt[k] / steps:5.0f}x  {per[k] / cnt[k]:6.2f} us  {k}")


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1,
                float(sys.argv[4]) if len(sys.argv) > 4 else None)
    elif sys.argv[1] == "--trace":
        trace(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 2048,
              int(sys.argv[4]) if len(sys.argv) > 4 else 1, sys.argv[5] if len(sys.argv) > 5 else "")
    else:
        profile(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 512,
                sys.argv[3] if len(sys.argv) > 3 else "")
