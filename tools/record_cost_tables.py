"""Record a cost table (lite/chain/cost_tables.py): prefill seconds per (prompt length, fixed chunk), and
what `--prefill auto` chose and took, for one model and setting; or check recorded tables.

    python3 tools/record_cost_tables.py MODEL OUT.json [--prompts 2048,8192,32768]
        [--chunks 1024,2048,4096,8192,16384] [--device cuda] [--experts host --expert-cache 25%]
        [--layer-split 2] [--kv f16] [--repeats 3] [--warmup 1]
    python3 tools/record_cost_tables.py --check tests/data/cost_tables/*.json

Trustworthy timings (issue 28): every size of a prompt length is measured in rounds; each round
runs the sizes in a rotated order (each size at each place in turn), and before each timed
prefill the same size runs `--warmup` untimed prefills, so the kernels for that shape are
compiled and the expert cache holds what that size leaves in it, whatever ran before. Every
prompt is fresh (a new random prompt: the prefix cache cannot serve it). The table keeps every
repeat; the check uses their median and prints the spread.

The setting's cost profile is calibrated first (the quick first-use calibration, a few seconds,
before any timing, whatever profile is saved); the profile auto used and the calibration's own
timings are recorded with the table.
"""
import argparse
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np


def _ints(s):
    return [int(x) for x in s.split(",") if x.strip()]


def _ids(engine, n, rng):
    return [int(x) for x in rng.integers(100, min(engine.cfg.n_vocab, 32000), size=n)]


def _prefill(engine, setting, ids):
    engine.chunk = setting
    engine.cached_ids = []                 # never a prefix hit
    for st in engine.stages:
        st.ops.synchronize()
    t0 = time.perf_counter()
    engine.prefill(ids)
    for st in engine.stages:
        st.ops.synchronize()
    return time.perf_counter() - t0


def record(args):
    from lite.chain.calibrate import CalibrationError, calibrate_engine, memory_max_chunk, profile_key
    from lite.chain.cost_profile import CostProfile
    from lite.chain.chunking import as_sizes
    from lite.chain.cost_tables import CostTable
    from lite.engine.engine import Engine
    from lite.files.hub import resolve_model
    split = None
    if args.layer_split:
        counts = _ints(args.layer_split)
        split = counts[0] if len(counts) == 1 else counts
    prompts = _ints(args.prompts)
    engine = Engine(resolve_model(args.model), device=args.device, max_context=max(prompts),
                    kv=args.kv, layer_split=split, experts=args.experts,
                    expert_cache=args.expert_cache, prefill_chunk="auto")
    key = profile_key(engine)
    print(f"recording {key}", file=sys.stderr)
    # The first-use calibration, made now (not a saved profile) with its timings kept in the
    # table, so that a CPU test can fit them again with the current fitting code.
    samples = []
    try:
        profile = calibrate_engine(engine, quick=True, samples=samples)
    except CalibrationError as e:           # as the engine does: the default constants
        print(f"{e}: the default cost profile", file=sys.stderr)
        profile = CostProfile().with_key(key)
    profile.max_chunk = memory_max_chunk(engine)
    engine.profile = profile
    table = CostTable(model=Path(args.model).name, setting=key, profile=profile,
                      command=" ".join(sys.argv), samples=samples)
    rng = np.random.default_rng(args.seed)
    for P in prompts:
        settings = sorted({min(c, P) for c in _ints(args.chunks)}) + ["auto"]
        runs = {s: [] for s in settings}
        for r in range(args.repeats):
            order = settings[r % len(settings):] + settings[:r % len(settings)]
            for s in order:
                for _ in range(args.warmup):
                    _prefill(engine, s, _ids(engine, P, rng))
                runs[s].append(_prefill(engine, s, _ids(engine, P, rng)))
                if s == "auto":
                    sched = tuple(as_sizes(P, engine.last_chunk))
        for s, secs in runs.items():
            if s == "auto":
                table.auto[P] = (sched, secs)
            else:
                table.fixed.setdefault(P, {})[s] = secs
            med = float(np.median(secs))
            print(f"  pp{P} chunk {s}: {P / med:,.0f} tok/s (median of {len(secs)}, spread "
                  f"{100 * (max(secs) - min(secs)) / med:.1f}%)", file=sys.stderr)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    extra = {"recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "commit": commit}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(table.to_json(extra) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


def check(paths):
    """Print, per table and prompt length, auto's measured time and the grid heuristic's pick
    against the best fixed chunk; exit status 1 when one is outside 3%."""
    from lite.chain.cost_tables import format_verdicts, heuristic_on_grid, measured_auto, read_table, refit
    bad = 0
    for p in paths:
        t = read_table(p)
        checks = [("auto (measured)", measured_auto(t)), ("heuristic on the table's sizes", heuristic_on_grid(t))]
        if t.samples:
            checks.append(("heuristic, the calibration fitted again", heuristic_on_grid(t, refit(t))))
        for name, verdicts in checks:
            print(f"{p}: {name}\n" + format_verdicts(t, verdicts))
            bad += sum(not v.ok for v in verdicts)
    print(json.dumps({"tables": len(paths), "outside_3pct": bad}))
    return 1 if bad else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--check", nargs="+", metavar="TABLE", help="check recorded tables instead")
    ap.add_argument("--prompts", default="2048,8192,32768")
    ap.add_argument("--chunks", default="1024,2048,4096,8192,16384")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--experts", default="auto")
    ap.add_argument("--expert-cache", default="auto")
    ap.add_argument("--layer-split", default=None)
    ap.add_argument("--kv", default="f16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.check:
        return check(args.check)
    if not (args.model and args.out):
        ap.error("MODEL and OUT are needed to record (or --check TABLE...)")
    record(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
