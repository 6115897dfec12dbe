"""The CUDA backend's attention for one decode token (kernels/cupy_decode.py): two launches a
layer, RoPE of q and k fused with the KV-cache store, then attention with its split merge.

A mixin of CUDABackend: it uses the backend's stream, pos_dev (the position on the device, so a
captured graph replays any position) and the merge counters made in its __init__.
"""


class CUDADecodeAttention:
    def rope(self, x, pos0, base, neox, n_rot=None, freq_scale=1.0, freq_factors=None):
        if freq_factors is not None:
            raise NotImplementedError("rope frequency factors on the GPU")
        n_rot = n_rot or x.shape[-1]
        if x.shape[0] == 1:
            # one decode token: attention rotates q and k in the launch that stores the cache
            return RopeLater(x, (n_rot, base, freq_scale, neox))
        return self.k.rope(self.cp.ascontiguousarray(x), pos0, base, neox, n_rot, freq_scale,
                           self.stream)

    def _attention_decode(self, kv, il, q, k, v, scale, window):
        """One token: rotate q and k, store k, v at pos_dev, attend over 0..pos_dev; two launches
        of fixed shapes (capturable)."""
        cp, int8 = self.cp, kv.kind == "int8"
        q, k, rope = self._rope_pending(q, k)
        ks, vs = (kv.ks[il], kv.vs[il]) if int8 else (None, None)
        q_rot = self.kd.rope_kv_store(cp.ascontiguousarray(q[0]), cp.ascontiguousarray(k[0]),
                                      cp.ascontiguousarray(v[0]), kv.k[il], kv.v[il], ks, vs,
                                      self.pos_dev, rope, self.stream)
        o = self.kd.attn_decode(q_rot, kv.k[il], kv.v[il], ks, vs, self.pos_dev, scale, window,
                                self._attn_counters, self.stream)
        return o.reshape(1, -1)

    def _rope_pending(self, q, k):
        """(q, k, rope) for rope_kv_store: both left unrotated by rope() with the same settings,
        or neither (rope None); anything else is rotated here first."""
        if (isinstance(q, RopeLater) and isinstance(k, RopeLater) and q.rope == k.rope):
            return q.x, k.x, q.rope
        q, k = (self._rope_now(t) if isinstance(t, RopeLater) else t for t in (q, k))
        return q, k, None

    def _rope_now(self, r):
        n_rot, base, freq_scale, neox = r.rope
        return self.k.rope(self.cp.ascontiguousarray(r.x), 0, base, neox, n_rot, freq_scale,
                           self.stream, self.pos_dev)


class RopeLater:
    """What rope() returns for one decode token: the input and its rotation, applied by the
    attention launch that also stores the KV cache (one launch instead of four). Only attention
    takes it; anything else fails on it loudly."""

    def __init__(self, x, rope):
        self.x, self.rope, self.shape = x, rope, x.shape

    def __getattr__(self, name):
        raise TypeError(f"a rotation left for attention (RopeLater) has no {name!r}: only "
                        f"CUDABackend.attention takes rope()'s one-token output")
