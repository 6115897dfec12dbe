"""Where do the GPU's hidden states first part from the CPU's? Layer by layer, row by row.

    python scripts/diff_layers.py gemma3 [--chunk 128] [--case N]

Runs one fixture prompt (the longest, by default) through a CPU and a CUDA engine at the same
prefill chunk, records every layer's output rows, and prints per layer the worst row's relative
difference (max |gpu - cpu| / max |cpu| over that row) and the rows past 1e-3.
"""
import argparse
import json
from pathlib import Path

import numpy as np

from lite.engine import Engine
from lite.hub import resolve_model


def record(engine):
    rows = {}                                     # layer -> list of (pos0, array)
    for st in engine.stages:
        fwd = st.fwd

        def hooked(ops, cfg, il, x, kv, pos0, _fwd=fwd):
            y = _fwd(ops, cfg, il, x, kv, pos0)
            if hasattr(ops, "done"):          # a one-token step's residual add may be held back
                y = ops.done(y)
            a = y.get() if hasattr(y, "get") else np.array(y)
            rows.setdefault(il, []).append((pos0, a.astype(np.float32)))
            return y
        st.fwd = hooked
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--case", type=int, default=None)
    a = ap.parse_args()
    path = resolve_model(a.model)
    key = "gemma3" if "gemma" in str(path) else "smollm2"
    cases = json.loads((Path(__file__).parent.parent / f"tests/fixtures/generate_{key}.json")
                       .read_text())["cases"]
    ids = (cases[a.case]["prompt_ids"] if a.case is not None
           else max((c["prompt_ids"] for c in cases), key=len))
    out = {}
    for dev in ("cpu", "cuda"):
        e = Engine(path, device=dev, max_context=len(ids) + 8, prefill_chunk=a.chunk)
        rec = record(e)
        out[dev] = (e.prefill(ids, all_logits=True), rec)
    for il in sorted(out["cpu"][1]):
        c = np.concatenate([r for _, r in sorted(out["cpu"][1][il], key=lambda t: t[0])])
        g = np.concatenate([r for _, r in sorted(out["cuda"][1][il], key=lambda t: t[0])])
        rel = np.abs(g - c).max(1) / np.maximum(np.abs(c).max(1), 1e-30)
        bad = np.nonzero(rel > 1e-3)[0]
        print(f"layer {il:3d}: worst row {rel.argmax():4d} rel {rel.max():.2e}  max|cpu| "
              f"{np.abs(c).max():10.1f}  rows > 1e-3: {len(bad)} {bad[:8].tolist()}")
    lc, lg = out["cpu"][0], out["cuda"][0]
    rel = np.abs(lg - lc).max(1) / np.abs(lc).max(1)
    print(f"logits: worst row {rel.argmax()} rel {rel.max():.2e}; rows > 1e-2: "
          f"{np.nonzero(rel > 1e-2)[0][:10].tolist()}")


if __name__ == "__main__":
    main()
