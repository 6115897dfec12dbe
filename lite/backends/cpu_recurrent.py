"""The Gated DeltaNet pieces of the CPU backend (qwen3next's recurrent layers), in NumPy float32:
the causal conv over a window carried between chunks, and the gated delta rule in its recurrent
form (decode, and the reference) and its chunked form (prefill, chunks of 64).

The delta rule, per value head with state S (dk, dv) and per token t:
    S = exp(g_t) S;  d = beta_t (v_t - S^T k_t);  S = S + k_t d^T;  o_t = S^T q_t
The chunked form computes the same within a chunk with a unit lower-triangular solve, and carries
S from chunk to chunk (docs/design.md "Hybrid models" outlines them).
"""
import numpy as np

DELTA_CHUNK = 64


def causal_conv_silu(x, w, state):
    """silu of the depthwise causal conv of x (T, C) with taps w (C, K), the last tap on the
    current row; state (K-1, C) holds the rows before x and is replaced by x's last K-1 rows."""
    T = x.shape[0]
    K = w.shape[1]
    full = np.concatenate([state, x], axis=0) if K > 1 else x     # (K-1+T, C)
    y = full[0:T] * w[:, 0]
    for j in range(1, K):
        y = y + full[j:j + T] * w[:, j]
    if K > 1:
        state[...] = full[T:]
    return y / (1.0 + np.exp(-y))


def _by_value_head(q, k, Hv):
    """q, k (T, Hk, dk) shared by the Hv/Hk value heads of each key head -> (Hv, T, dk)."""
    r = Hv // q.shape[1]
    return (np.repeat(q, r, axis=1).transpose(1, 0, 2), np.repeat(k, r, axis=1).transpose(1, 0, 2))


def delta_rule_recurrent(q, k, v, g, beta, S, scale):
    """q, k (T, Hk, dk); v (T, Hv, dv); g (log decay), beta (T, Hv); S (Hv, dk, dv) updated in
    place. Returns o (T, Hv, dv)."""
    T, Hv, dv = v.shape
    qh, kh = _by_value_head(q, k, Hv)                  # (Hv, T, dk)
    out = np.empty((T, Hv, dv), np.float32)
    decay = np.exp(g)                                  # (T, Hv)
    for t in range(T):
        S *= decay[t][:, None, None]
        kt = kh[:, t]                                  # (Hv, dk)
        d = beta[t][:, None] * (v[t] - np.einsum("hkv,hk->hv", S, kt))
        S += kt[:, :, None] * d[:, None, :]
        out[t] = np.einsum("hkv,hk->hv", S, qh[:, t]) * np.float32(scale)
    return out


def _solve_unit_lower(A, R):
    """X with (I + A) X = R, A (H, n, n) strictly lower triangular: forward substitution."""
    X = np.empty_like(R)
    for i in range(R.shape[1]):
        X[:, i] = R[:, i] - np.einsum("hj,hjc->hc", A[:, i, :i], X[:, :i])
    return X


def delta_rule_chunked(q, k, v, g, beta, S, scale, chunk=DELTA_CHUNK):
    """The same result as delta_rule_recurrent, chunk tokens at a time: within a chunk
    G = cumsum(g), D_ij = exp(G_i - G_j) (j <= i), A = strictly_lower((beta K) K^T * D),
    W = (I+A)^-1 (beta exp(G) K), U = (I+A)^-1 (beta V), Vn = U - W S,
    O = (Q exp(G)) S + tril(Q K^T * D) Vn, S = exp(G_last) S + (K exp(G_last - G))^T Vn."""
    T, Hv, dv = v.shape
    qh, kh = _by_value_head(q, k, Hv)
    qh = qh * np.float32(scale)
    vh = v.transpose(1, 0, 2)                          # (Hv, T, dv)
    gh, bh = g.T.astype(np.float32), beta.T.astype(np.float32)   # (Hv, T)
    out = np.empty((Hv, T, dv), np.float32)
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(c0 + chunk, T))
        Q, K, V, B = qh[:, sl], kh[:, sl], vh[:, sl], bh[:, sl]
        G = np.cumsum(gh[:, sl], axis=1)               # (Hv, n)
        n = G.shape[1]
        lower = np.tril(np.ones((n, n), bool))
        # mask before exponentiating: above the diagonal G_i - G_j > 0 and can overflow
        D = np.where(lower, np.exp(np.where(lower, G[:, :, None] - G[:, None, :], 0.0)), 0.0)
        D = D.astype(np.float32)                       # (Hv, n, n)
        KB = K * B[:, :, None]
        A = np.tril((KB @ K.transpose(0, 2, 1)) * D, -1)
        eG = np.exp(G)[:, :, None]
        WU = _solve_unit_lower(A, np.concatenate([KB * eG, V * B[:, :, None]], axis=2))
        W, U = WU[:, :, :K.shape[2]], WU[:, :, K.shape[2]:]
        Vn = U - W @ S                                 # (Hv, n, dv)
        out[:, sl] = (Q * eG) @ S + ((Q @ K.transpose(0, 2, 1)) * D) @ Vn
        G_last = G[:, -1]
        S *= np.exp(G_last)[:, None, None]
        S += (K * np.exp(G_last[:, None] - G)[:, :, None]).transpose(0, 2, 1) @ Vn
    return np.ascontiguousarray(out.transpose(1, 0, 2))
