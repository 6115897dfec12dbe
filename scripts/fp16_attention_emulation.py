"""Which fp16 rounding of the GPU prefill moves Gemma 3's logits? The CPU path, with chosen
roundings to fp16 patched in, against the plain CPU path, on the longest Gemma 3 fixture prompt.

    python scripts/fp16_attention_emulation.py MODE      # x | xw | q | p | qp

x: inputs of every linear layer; xw: and their weights (and the output head); q: x and the attention
queries; p: the attention probabilities; qp: queries and probabilities (what the materialized GPU
attention did before it used hi+lo pairs). Prints the logits past 1e-2 (relative, plus 1% of the
largest) and their rows. Session 2 on this machine: x, xw, q, p: none; qp: 1,214 at position 335,
the position that failed on the H200.
"""
import json
import sys
from pathlib import Path

import numpy as np

from lite.backends import cpu as C
from lite.engine import Engine
from lite.hub import KNOWN, cache_dir


def h(a):
    return a.astype(np.float16).astype(np.float32)


def patch(mode):
    B = C.CPUBackend if hasattr(C, "CPUBackend") else next(
        v for v in vars(C).values() if isinstance(v, type) and hasattr(v, "linear"))
    lin, out, att = B.linear, B.output, B.attention

    def linear(self, x, name):
        if mode in ("x", "xw", "q"):
            x = h(x)
        if mode == "xw" and name not in self.__dict__.setdefault("_h16", set()):
            self.w[name] = h(self.w[name])
            self._h16.add(name)
        return lin(self, x, name)

    def output(self, x):
        if mode in ("x", "xw"):
            x = h(x)
        if mode == "xw" and self._out is None and "output.weight" not in self.w:
            self._out = h(C.dequantize_tensor(self.gguf.tensors["token_embd.weight"]))
        return out(self, x)

    def attention(self, kv, il, q, k, v, pos0, scale, window=0):
        if mode in ("q", "qp"):
            q = h(q)
        if mode not in ("p", "qp"):
            return att(self, kv, il, q, k, v, pos0, scale, window)
        T, H, D = q.shape                     # the CPU attention with P rounded before P @ V
        kv.write(il, k, v, pos0)
        K, V = kv.read(il, pos0 + T)
        Hkv, S, Dv = V.shape
        qh = q.reshape(T, Hkv, H // Hkv, D).transpose(1, 2, 0, 3)
        s = (qh @ K[:, None].transpose(0, 1, 3, 2)) * np.float32(scale)
        qpos, kpos = np.arange(pos0, pos0 + T)[:, None], np.arange(S)[None, :]
        masked = (kpos > qpos) | (((qpos - kpos) >= window) if window else False)
        s = np.where(masked, np.float32(-np.inf), s)
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = h(p / p.sum(axis=-1, keepdims=True))
        o = p @ V[:, None]
        return np.ascontiguousarray(o.transpose(2, 0, 1, 3)).reshape(T, H * Dv)

    B.linear, B.output, B.attention = linear, output, attention


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "qp"
    path = str(cache_dir() / "models" / KNOWN["gemma3"].filename)
    fixtures = Path(__file__).parent.parent / "tests/fixtures/generate_gemma3.json"
    ids = max((c["prompt_ids"] for c in json.loads(fixtures.read_text())["cases"]), key=len)
    run = lambda: Engine(path, device="cpu", max_context=1024,  # noqa: E731
                         prefill_chunk=128).prefill(ids, all_logits=True)
    ref = run()
    patch(mode)
    got = run()
    bad = np.abs(got - ref) > 1e-2 * np.abs(ref) + 1e-2 * np.abs(ref).max()
    print(f"{mode}: {len(ids)} positions, {bad.sum()} logits past 1e-2, rows "
          f"{np.nonzero(bad.any(1))[0][:10].tolist()}, largest difference {np.abs(got - ref).max():.3f}")


if __name__ == "__main__":
    main()
