"""Top-1 agreement between --kv f16 and --kv int8 over generated tokens.

    python scripts/kv_agreement.py [MODEL] [--device cpu|cuda] [-n 256]

For each fixture prompt: 256 greedy tokens with an f16 cache; the same sequence then runs through an
int8-cache engine (teacher forcing), and we count the positions where both pick the same top token.
Also reports where a free-running int8 generation first departs from the f16 one.
"""
import argparse
import json
from pathlib import Path

import numpy as np

from lite.engine import Engine
from lite.hub import resolve_model
from lite.sampling import Sampler, SamplingParams


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-n", type=int, default=256)
    a = ap.parse_args()
    path = resolve_model(a.model)
    cases = json.loads((Path(__file__).parent.parent / "tests/fixtures/generate_smollm2.json")
                       .read_text())["cases"]
    greedy = Sampler(SamplingParams.greedy())
    ctx = 2048                      # the longest fixture prompt (~920 tokens) plus -n
    f16 = Engine(path, device=a.device, max_context=ctx, kv="f16")
    i8 = Engine(path, device=a.device, max_context=ctx, kv="int8")
    agree = total = 0
    for c in cases:
        ids = c["prompt_ids"]
        f16.cached_ids, i8.cached_ids = [], []
        gen = list(f16.generate(ids, a.n, greedy, stop_at_eog=False))
        lg = i8.prefill(ids + gen[:-1], all_logits=True)[len(ids) - 1:]
        same = int((lg.argmax(-1) == np.array(gen)).sum())
        i8.cached_ids = []
        free = list(i8.generate(ids, a.n, greedy, stop_at_eog=False))
        first = next((k for k, (x, y) in enumerate(zip(gen, free)) if x != y), None)
        agree += same
        total += len(gen)
        print(f"{c['text'][:32]!r:36s} top-1 agreement {same}/{len(gen)}; free-running int8 "
              f"departs at token {first}")
    print(f"overall top-1 agreement f16 vs int8: {agree}/{total} = {agree / total:.1%}")


if __name__ == "__main__":
    main()
