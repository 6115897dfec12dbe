"""The CUDA backend's attention for one decode token (kernels/cupy_decode.py): two launches a
layer, RoPE of q and k (and, unless LITE_FOLD_QK_NORM=0, qwen3's per-head RMSNorm of q and k
before it) fused with the KV-cache store, then attention with its split merge.

A mixin of CUDABackend: it uses the backend's stream, pos_dev (the position on the device, so a
captured graph replays any position), its weights and the merge counters made in its __init__.
"""
import numpy as np


class CUDADecodeAttention:
    @property
    def fold_qk_norm(self):
        """BackendConfig.fold_qk_norm: rms_norm of one decode token's q or k heads is left for the
        attention launch (_norm_later); off: the separate norm launches."""
        return self.config.fold_qk_norm

    def _norm_later(self, x, name, eps):
        """rms_norm's hook for x (1, heads, head_dim), a decode token's q or k: a NormLater that
        rope() and attention take, so rope_kv_store norms the heads in the launch that rotates and
        stores them (one launch fewer each). The same norm now where the weights do not fit."""
        w = self.w[name].data
        if w.dtype != np.float32 or w.shape != x.shape[-1:]:
            return self.k.rms_norm(self.cp.ascontiguousarray(x), w, eps, self.stream)
        return NormLater(x, w, eps)

    def rope(self, x, pos0, base, neox, n_rot=None, freq_scale=1.0, freq_factors=None):
        if freq_factors is not None:
            raise NotImplementedError("rope frequency factors on the GPU")
        n_rot = n_rot or x.shape[-1]
        if x.shape[0] == 1:
            # one decode token: attention rotates q and k in the launch that stores the cache
            return RopeLater(x, (n_rot, base, freq_scale, neox))
        return self.k.rope(self.cp.ascontiguousarray(self._norm_now(x)), pos0, base, neox, n_rot,
                           freq_scale, self.stream)

    def _attention_decode(self, kv, il, q, k, v, scale, window):
        """One token: norm and rotate q and k, store k, v at pos_dev, attend over 0..pos_dev; two
        launches of fixed shapes (capturable)."""
        cp, int8 = self.cp, kv.kind == "int8"
        q, k, rope = self._rope_pending(q, k)
        q, k, norm = self._norm_pending(q, k)
        v = self._norm_now(v)
        ks, vs = (kv.ks[il], kv.vs[il]) if int8 else (None, None)
        q_rot = self.kd.rope_kv_store(cp.ascontiguousarray(q[0]), cp.ascontiguousarray(k[0]),
                                      cp.ascontiguousarray(v[0]), kv.k[il], kv.v[il], ks, vs,
                                      self.pos_dev, rope, self.stream, norm, pdl=self.pdl)
        o = self.kd.attn_decode(q_rot, kv.k[il], kv.v[il], ks, vs, self.pos_dev, scale, window,
                                self._attn_counters, self.stream, pdl=self.pdl)
        return o.reshape(1, -1)

    def _rope_pending(self, q, k):
        """(q, k, rope) for rope_kv_store: both left unrotated by rope() with the same settings,
        or neither (rope None); anything else is rotated here first. q and k may still be
        NormLater (see _norm_pending)."""
        if (isinstance(q, RopeLater) and isinstance(k, RopeLater) and q.rope == k.rope):
            return q.x, k.x, q.rope
        q, k = (self._rope_now(t) if isinstance(t, RopeLater) else t for t in (q, k))
        return q, k, None

    def _norm_pending(self, q, k):
        """(q, k, norm) for rope_kv_store: norm (q weights or None, k weights or None, eps) for
        those left unnormed by _norm_later (None if neither); a second eps is normed here."""
        nq, nk = (t if isinstance(t, NormLater) else None for t in (q, k))
        if nq is not None and nk is not None and nq.eps != nk.eps:
            k, nk = self._norm_now(k), None
        if nq is None and nk is None:
            return q, k, None
        qw, kw = (None if t is None else t.w for t in (nq, nk))
        eps = (nq if nq is not None else nk).eps
        return (q if nq is None else q.x), (k if nk is None else k.x), (qw, kw, eps)

    def _rope_now(self, r):
        n_rot, base, freq_scale, neox = r.rope
        return self.k.rope(self.cp.ascontiguousarray(self._norm_now(r.x)), 0, base, neox, n_rot,
                           freq_scale, self.stream, self.pos_dev)

    def _norm_now(self, x):
        """x itself, or the norm a NormLater left, as the rms_norm kernel (a launch)."""
        if not isinstance(x, NormLater):
            return x
        return self.k.rms_norm(self.cp.ascontiguousarray(x.x), x.w, x.eps, self.stream)


class RopeLater:
    """What rope() returns for one decode token: the input (an array or a NormLater) and its
    rotation, applied by the attention launch that also stores the KV cache (one launch instead
    of four). Only attention takes it; anything else fails on it loudly."""

    def __init__(self, x, rope):
        self.x, self.rope, self.shape = x, rope, x.shape

    def __getattr__(self, name):
        raise TypeError(f"a rotation left for attention (RopeLater) has no {name!r}: only "
                        f"CUDABackend.attention takes rope()'s one-token output")


class NormLater:
    """What rms_norm returns, with LITE_FOLD_QK_NORM=1, for one decode token's q or k heads
    (1, heads, head_dim): the input, the (head_dim,) f32 weights and eps, applied per head by
    rope_kv_store before the rotation. Only rope() and attention take it; anything else fails
    on it loudly."""

    def __init__(self, x, w, eps):
        self.x, self.w, self.eps, self.shape = x, w, eps, x.shape

    def __getattr__(self, name):
        raise TypeError(f"a per-head norm left for attention (NormLater) has no {name!r}: only "
                        f"CUDABackend.rope and .attention take it (LITE_FOLD_QK_NORM=1)")
