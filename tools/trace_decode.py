"""The decode step's kernels as they run inside the replayed CUDA graph, each kernel's own GPU time
(tools/profile_decode.py replays each op alone, launch overhead included): Nsight Compute
(the device image has ncu, not nsys) times every kernel node of the captured steps only.

    ncu --profile-from-start off --graph-profiling node --clock-control none \
        --metrics gpu__time_duration.sum --csv python3 tools/trace_decode.py MODEL.gguf [n] [steps] > K.csv
    python3 tools/trace_decode.py --summary K.csv [steps] [graph replay us]

The summary: per kernel name, the count a step and the GPU time a step; their sum against the
graph replay's time (profile_decode's "GPU time per replay"): the rest is the gaps between
dependent kernels (launch latency, drain, ramp-up), which no kernel's speed removes.
"""
import csv
import sys
from collections import defaultdict


def run(path, n, steps):
    import cupy
    import numpy as np

    from lite.engine import Engine
    from lite.sampling import Sampler, SamplingParams
    e = Engine(path, device="cuda", max_context=n + steps + 64)
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
    else:
        run(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2048,
            int(sys.argv[3]) if len(sys.argv) > 3 else 1)
