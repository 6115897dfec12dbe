"""KV cache: preallocated per stage for its layers up to max_context.

kind "f32" | "f16" | "int8"; int8 keeps one float32 scale per token and head (symmetric, max-abs).
Written through the array module of the backend (numpy or cupy), so one class serves both.
"""
import numpy as np

from lite.errors import ContextOverflowError

KV_KINDS = ("f16", "int8", "f32")


def kv_bytes_per_token(cfg, n_layers, kind):
    per_val = {"f32": 4, "f16": 2, "int8": 1}[kind]
    b = n_layers * cfg.n_head_kv * (cfg.head_dim + cfg.v_head_dim) * per_val
    if kind == "int8":
        b += n_layers * cfg.n_head_kv * 2 * 4
    return b


class KVCache:
    def __init__(self, cfg, layers, max_context, kind="f16", xp=np):
        if kind not in KV_KINDS:
            raise ValueError(f"kv cache type must be one of {', '.join(KV_KINDS)}, got {kind!r}")
        self.kind, self.max_context, self.xp = kind, int(max_context), xp
        dtype = {"f32": np.float32, "f16": np.float16, "int8": np.int8}[kind]
        H, S = cfg.n_head_kv, self.max_context
        self.k = {il: xp.zeros((H, S, cfg.head_dim), dtype) for il in layers}       # (Hkv, S, D)
        self.v = {il: xp.zeros((H, S, cfg.v_head_dim), dtype) for il in layers}     # (Hkv, S, Dv)
        if kind == "int8":
            self.ks = {il: xp.zeros((H, S), np.float32) for il in layers}           # (Hkv, S)
            self.vs = {il: xp.zeros((H, S), np.float32) for il in layers}

    def check_fits(self, n_tokens):
        if n_tokens > self.max_context:
            raise ContextOverflowError(
                f"{n_tokens} tokens do not fit the context of {self.max_context} "
                f"(raise --max-context, or shorten the prompt or -n)")

    def _quantize(self, x):                     # x (T, H, D) f32 -> int8 (H, T, D), scales (H, T)
        xp = self.xp
        amax = xp.abs(x).max(axis=-1)
        scale = (amax / 127.0).astype(np.float32)
        safe = xp.where(scale > 0, scale, np.float32(1.0))
        q = xp.clip(xp.rint(x / safe[..., None]), -127, 127).astype(np.int8)
        return q.transpose(1, 0, 2), scale.T

    def write(self, il, k, v, pos0):
        """k (T, Hkv, D), v (T, Hkv, Dv) float32 at positions pos0..pos0+T-1."""
        T = k.shape[0]
        self.check_fits(pos0 + T)
        if self.kind == "int8":
            qk, sk = self._quantize(k)
            qv, sv = self._quantize(v)
            self.k[il][:, pos0:pos0 + T] = qk
            self.v[il][:, pos0:pos0 + T] = qv
            self.ks[il][:, pos0:pos0 + T] = sk
            self.vs[il][:, pos0:pos0 + T] = sv
        else:
            self.k[il][:, pos0:pos0 + T] = k.transpose(1, 0, 2)
            self.v[il][:, pos0:pos0 + T] = v.transpose(1, 0, 2)

    def read(self, il, n):
        """The first n positions as float32: (Hkv, n, D), (Hkv, n, Dv)."""
        k, v = self.k[il][:, :n], self.v[il][:, :n]
        if self.kind == "int8":
            return (k.astype(np.float32) * self.ks[il][:, :n, None],
                    v.astype(np.float32) * self.vs[il][:, :n, None])
        return k.astype(np.float32), v.astype(np.float32)
