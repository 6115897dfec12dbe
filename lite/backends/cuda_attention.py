"""The CUDA backend's sequence mixers: attention, and the hybrid's Gated DeltaNet (at the end).

A prefill chunk: flash attention (kernels/flash_attention.py) where the head dim allows, else the
materialized path (scores through memory, cuBLAS). One decode token (kernels/decode_attention.py):
two launches a layer, RoPE of q and k (and, with BackendConfig.fold_qk_norm, qwen3's per-head
RMSNorm of q and k before it) fused with the KV-cache store, then attention with its split merge.

A mixin of CUDABackend: it uses the backend's stream, config, pdl, pos_dev (the position on the
device, so a captured graph replays any position), its weights and the merge counters made in its
__init__.
"""
import numpy as np

from lite.backend_config import CHOICES


ATTN_SCRATCH_BYTES = 2 << 30      # scores + probabilities of the heads attended at once


class CUDAAttention:
    @property
    def fold_qk_norm(self):
        """BackendConfig.fold_qk_norm: rms_norm of one decode token's q or k heads is left for the
        attention launch (norm_later); off: the separate norm launches."""
        return self.config.fold_qk_norm

    def norm_later(self, x, name, eps):
        """rms_norm's hook for x (1, heads, head_dim), a decode token's q or k: a NormLater that
        rope() and attention take, so rope_kv_store norms the heads in the launch that rotates and
        stores them (one launch fewer each). The same norm now where the weights do not fit."""
        w = self.w[name].data
        if w.dtype != np.float32 or w.shape != x.shape[-1:]:
            return self.small_ops.rms_norm(self.cp.ascontiguousarray(x), w, eps, self.stream)
        return NormLater(x, w, eps)

    def rope(self, x, pos0, base, neox, n_rot=None, freq_scale=1.0, freq_factors=None):
        if freq_factors is not None:
            raise NotImplementedError("rope frequency factors on the GPU")
        n_rot = n_rot or x.shape[-1]
        if x.shape[0] == 1:
            # one decode token: attention rotates q and k in the launch that stores the cache
            return RopeLater(x, (n_rot, base, freq_scale, neox))
        return self.small_ops.rope(self.cp.ascontiguousarray(self.norm_now(x)), pos0, base, neox,
                                   n_rot, freq_scale, self.stream)

    def attention(self, kv, il, q, k, v, pos0, scale, window=0):
        """A chunk of T queries against the cache up to pos0+T, on tensor cores (one token: the decode
        path below). Head dims 64 and 128 (with BackendConfig.flash_attention), and 256 (with
        flash_attention_256 too): one flash-attention kernel, kernels/flash_attention.py. Else,
        the materialized path (every head dim): per KV head, scores (G*T, S) = Q K^T (fp16 in,
        fp32 out), masked softmax to fp16 probabilities, then P V (fp16 in, fp32 out), heads
        batched in groups whose scores fit ATTN_SCRATCH_BYTES, so a chunk x context score matrix
        never exists for all heads at once."""
        T = q.shape[0]
        if T == 1:
            return self._attention_decode(kv, il, q, k, v, scale, window)
        kv.write(il, k, v, pos0)
        if kv.kind == "f16":
            K, V = kv.k[il], kv.v[il]                          # (Hkv, S_max, D) f16, first S used
        else:
            K, V = (a.astype(np.float16) for a in kv.read(il, pos0 + T))
        return self.attend(q, K, V, pos0, scale, window)

    def attend(self, q, K, V, pos0, scale, window=0):
        """q (T, H, D) at positions pos0.. causally over the first pos0 + T positions of the f16
        caches K (Hkv, S_max, D), V (Hkv, S_max, Dv), their k and v already there -> (T, H * Dv):
        flash attention where flash_prefill_takes the head dims, else the materialized path."""
        cp = self.cp
        T, H, D = q.shape
        S = pos0 + T
        from lite.kernels import flash_attention
        if self.flash_prefill_takes(D, V.shape[2]):    # int8: through the f16 copy above
            out = flash_attention.flash_prefill(q, K, V, pos0, window, scale, self.stream)
            return out.reshape(T, -1)
        Hkv, s_stride, Dv = V.shape[0], V.shape[1], V.shape[2]
        G = H // Hkv
        rows = G * T
        # q and the probabilities each go in as two fp16 halves (x = hi + lo, lo = fp16(x - hi)):
        # four GEMMs instead of two, but scores and weights then carry ~fp32 precision. One fp16
        # rounding of q and P moved Gemma 3 logits by up to 1.4 at a position with sharp attention
        # (CPU emulation reproduces it); this path serves head dims flash does not (Gemma's 256
        # unless flash_attention_256: the flash kernel rounds q and P to fp16 once).
        qf = cp.ascontiguousarray(q.reshape(T, Hkv, G, D).transpose(1, 2, 0, 3))
        q16 = qf.astype(np.float16)
        q16_lo = (qf - q16).astype(np.float16)
        out = cp.empty((Hkv, rows, Dv), np.float32)                            # (Hkv, G*T, Dv)
        per_head = rows * S * 12                 # scores f32, P hi+lo f16, a f32 temporary
        group = max(1, min(Hkv, ATTN_SCRATCH_BYTES // per_head))
        for h0 in range(0, Hkv, group):
            nb = min(group, Hkv - h0)
            scores = cp.empty((nb, rows, S), np.float32)
            # column-major view: scores^T (S x rows) = K (S x D) . Q^T (D x rows)
            for qpart, beta in ((q16, 0.0), (q16_lo, 1.0)):
                gemm_strided(cp, self.stream, 1, 0, S, rows, D,
                             K[h0:h0 + nb], 2, D, s_stride * D, qpart[h0:h0 + nb], 2, D, rows * D,
                             scores, 0, S, rows * S, nb, beta=beta)
            self.small_ops.masked_softmax(scores, T, pos0, window, scale, self.stream)   # probs in place
            probs = scores.astype(np.float16)
            probs_lo = (scores - probs).astype(np.float16)
            del scores
            # out^T (Dv x rows) = V^T (Dv x S) . P^T (S x rows)
            for ppart, beta in ((probs, 0.0), (probs_lo, 1.0)):
                gemm_strided(cp, self.stream, 0, 0, Dv, rows, S,
                             V[h0:h0 + nb], 2, Dv, s_stride * Dv, ppart, 2, S, rows * S,
                             out[h0:h0 + nb], 0, Dv, rows * Dv, nb, beta=beta)
        o = out.reshape(Hkv, G, T, Dv).transpose(2, 0, 1, 3)
        return cp.ascontiguousarray(o).reshape(T, H * Dv)

    def flash_prefill_takes(self, D, Dv):
        """Whether a prefill chunk's attention at head dims D, Dv runs the flash kernel: with
        BackendConfig.flash_attention where the kernel takes them, head dim 256 only with
        BackendConfig.flash_attention_256 too."""
        from lite.kernels.flash_attention import supported
        return (self.config.flash_attention and supported(D, Dv)
                and (D <= 128 or self.config.flash_attention_256))

    def paged_flash_takes(self, D, Dv):
        """Whether a server step's prompt chunks at head dims D, Dv run the flash kernel over the
        pages (BackendConfig.paged_flash, where flash_prefill_takes them); else their pages are
        gathered for attend."""
        return self.config.paged_flash and self.flash_prefill_takes(D, Dv)

    def _attention_decode(self, kv, il, q, k, v, scale, window):
        """One token: norm and rotate q and k, store k, v at pos_dev, attend over 0..pos_dev; two
        launches of fixed shapes (capturable)."""
        cp, int8 = self.cp, kv.kind == "int8"
        q, k, rope = self._rope_pending(q, k)
        q, k, norm = self._norm_pending(q, k)
        v = self.norm_now(v)
        ks, vs = (kv.ks[il], kv.vs[il]) if int8 else (None, None)
        q_rot = self.decode_attn.rope_kv_store(
            cp.ascontiguousarray(q[0]), cp.ascontiguousarray(k[0]), cp.ascontiguousarray(v[0]),
            kv.k[il], kv.v[il], ks, vs, self.pos_dev, rope, self.stream, norm, pdl=self.pdl)
        o = self.decode_attn.attention(q_rot, kv.k[il], kv.v[il], ks, vs, self.pos_dev, scale,
                                       window, self.attn_counters, self.stream, pdl=self.pdl)
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
        those left unnormed by norm_later (None if neither); a second eps is normed here."""
        nq, nk = (t if isinstance(t, NormLater) else None for t in (q, k))
        if nq is not None and nk is not None and nq.eps != nk.eps:
            k, nk = self.norm_now(k), None
        if nq is None and nk is None:
            return q, k, None
        qw, kw = (None if t is None else t.w for t in (nq, nk))
        eps = (nq if nq is not None else nk).eps
        return (q if nq is None else q.x), (k if nk is None else k.x), (qw, kw, eps)

    def _rope_now(self, r):
        n_rot, base, freq_scale, neox = r.rope
        return self.small_ops.rope(self.cp.ascontiguousarray(self.norm_now(r.x)), 0, base, neox,
                                   n_rot, freq_scale, self.stream, self.pos_dev)

    def norm_now(self, x):
        """x itself, or the norm a NormLater left, as the rms_norm kernel (a launch)."""
        if not isinstance(x, NormLater):
            return x
        return self.small_ops.rms_norm(self.cp.ascontiguousarray(x.x), x.w, x.eps, self.stream)


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
    """What rms_norm returns, with fold_qk_norm on, for one decode token's q or k heads
    (1, heads, head_dim): the input, the (head_dim,) f32 weights and eps, applied per head by
    rope_kv_store before the rotation. Only rope() and attention take it; anything else fails
    on it loudly."""

    def __init__(self, x, w, eps):
        self.x, self.w, self.eps, self.shape = x, w, eps, x.shape

    def __getattr__(self, name):
        raise TypeError(f"a per-head norm left for attention (NormLater) has no {name!r}: only "
                        f"CUDABackend.rope and .attention take it (fold_qk_norm)")


def gemm_strided(cp, stream, transa, transb, m, n, k, A, a_type, lda, stride_a, B, b_type, ldb,
                 stride_b, C, c_type, ldc, stride_c, batch, beta=0.0):
    """cublasGemmStridedBatchedEx in column-major terms, fp32 accumulation; types: 0 f32, 2 f16.
    C = A B + beta C."""
    from cupy_backends.cuda.libs import cublas
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, stream.ptr)
    one = np.array(1.0, np.float32)
    b = np.array(beta, np.float32)
    cublas.gemmStridedBatchedEx(handle, transa, transb, m, n, k, one.ctypes.data,
                                A.data.ptr, a_type, lda, stride_a, B.data.ptr, b_type, ldb, stride_b,
                                b.ctypes.data, C.data.ptr, c_type, ldc, stride_c, batch,
                                cublas.CUBLAS_COMPUTE_32F, cublas.CUBLAS_GEMM_DEFAULT)


# --- the hybrid's (qwen3next) recurrent mixer ------------------------------------------------------
# The Gated DeltaNet's conv, norms, gates and delta rule (kernels/delta_rule.py), gated attention's
# output gate, and the per-layer recurrent state: the CPU backend's "hybrid's ops" (lite/backends/
# cpu.py), float32 on the backend's stream. The states are the stage's RecurrentState
# (lite/engine/kv_cache.py), made with the backend's array module, so they live on this device. A mixin of
# CUDABackend: it uses its cp, stream, w (the weights) and as_array (lazy values made arrays, cuda_norm.py).
def _dr():
    """kernels/delta_rule.py, imported on first use: it needs CuPy, which this module must not
    (lite.backends.cuda is imported on machines without it to say why there is no GPU)."""
    from lite.kernels import delta_rule
    return delta_rule


class CUDARecurrent:
    def _small_f32(self, name):
        """A small weight (ssm_a, ssm_dt.bias, the conv taps) as a float32 device array in its numpy
        shape, converted once: the kernels read float32 whatever the file stores."""
        cache = self.__dict__.setdefault("_recurrent_f32", {})
        if name not in cache:
            w = self.w[name]
            if w.qtype in ("F32", "F16") and w.data.dtype != np.uint8:
                a = w.data.astype(np.float32)
            else:                          # quantized (or a 3-D F16 kept as bytes): its blocks
                from lite.kernels import dequantize
                a = dequantize(w.data.reshape(-1), w.qtype, np.float32, self.stream)
            cache[name] = self.cp.ascontiguousarray(a).reshape(w.shape)
        return cache[name]

    def sigmoid_mul(self, x, gate):
        """x * sigmoid(gate), elementwise (gated attention's output gate)."""
        return _dr().sigmoid_mul(self.as_array(x), self.as_array(gate), self.stream)

    def l2_norm(self, x, eps):                              # over the last axis
        return _dr().l2_norm(self.as_array(x), eps, self.stream)

    def concat(self, xs):                                   # along the last axis
        with self.stream:
            return self.cp.concatenate([self.as_array(x) for x in xs], axis=-1)

    def delta_gates(self, b, a, a_name, dt_bias_name):
        """beta = sigmoid(b); g = ssm_a * softplus(a + dt_bias), the log decay. (T, Hv) each."""
        return _dr().gates(self.as_array(b), self.as_array(a), self._small_f32(a_name), self._small_f32(dt_bias_name),
                           self.stream)

    def recurrent_state(self, kv, il, pos0, n_tokens):
        """The (conv, delta-rule) state of layer il that a chunk of n_tokens at pos0 updates in
        place (cleared on this stream when pos0 is 0)."""
        with self.stream:
            return kv.recurrent.take(il, pos0, n_tokens)

    def conv_silu(self, x, name, state):
        """silu(causal conv of x (T, C)), the window before x in state (K-1, C), updated in place."""
        w = self._small_f32(name)
        return _dr().conv_silu(self.as_array(x), w.reshape(w.shape[0], -1), state, self.stream)

    def delta_rule(self, q, k, v, g, beta, state, scale):
        """The gated delta rule over a chunk: the recurrence for one token (decode), the chunked
        form for more (on the tensor cores with BackendConfig.delta_rule_mma, where the head dims
        allow); state (Hv, dk, dv) updated in place. -> (T, Hv, dv)."""
        dr = _dr()
        step = dr.decode if q.shape[0] == 1 else dr.chunked
        mode = self.config.delta_rule_mma
        if mode not in CHOICES["delta_rule_mma"]:
            raise ValueError(f"delta_rule_mma {mode!r}: expected one of {', '.join(CHOICES['delta_rule_mma'])}")
        if step is dr.chunked and mode != "off":
            from lite.kernels import delta_rule_mma
            if delta_rule_mma.supports(state.shape[1], state.shape[2]):
                return delta_rule_mma.chunked(q, k, v, g, beta, state, scale, self.stream, split=mode == "3xtf32")
        return step(q, k, v, g, beta, state, scale, self.stream)

    @property
    def fused_delta_step(self):
        """BackendConfig.hybrid_graphs: one decode token of a recurrent layer is delta_step (one
        launch) instead of gates, conv, two norms and the delta rule (five and their copies)."""
        return self.config.hybrid_graphs

    def delta_step(self, qkv, ba, names, conv_state, ssm_state, eps, scale):
        """One token from the layer's projections, qkv (1, C) before the conv and ba (1, Hk * 2r):
        the conv + silu (window updated in place), q and k L2-normed, the gates, the delta rule
        (state in place) -> (1, Hv, dv). names: the conv taps, ssm_a and ssm_dt.bias."""
        taps, a_name, dt_name = names
        w = self._small_f32(taps)
        Hk = (w.shape[0] - ssm_state.shape[0] * ssm_state.shape[2]) // (2 * ssm_state.shape[1])
        counters = self.__dict__.get("_delta_counters")
        if counters is None or counters.size < Hk:          # zeros, left zero by every launch
            with self.stream:
                counters = self._delta_counters = self.cp.zeros(max(Hk, 1), np.int32)
        return _dr().decode_fused(self.as_array(qkv), self.as_array(ba), w.reshape(w.shape[0], -1),
                                  conv_state, self._small_f32(a_name), self._small_f32(dt_name),
                                  ssm_state, counters, eps, scale, self.stream)
