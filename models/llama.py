"""The llama family: llama, qwen2 (attention biases), qwen3 (per-head QK RMSNorm).

One layer's forward, written only against the ops interface (lite/backends/ops.py Ops), so the CPU
and GPU share it.
Shapes: x (T, n_embd); q (T, n_head, head_dim); k, v (T, n_head_kv, head_dim).
"""


def attention_block(ops, cfg, il, h, kv, pos0, window=0, residual=None):
    """Pre-normed hidden h (T, n_embd) -> attention output (T, n_embd), cache written at pos0;
    plus `residual` when one is given (see linear_residual)."""
    p = f"blk.{il}."
    T = h.shape[0]
    q, k, v = ops.linear_many(h, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
    q = q.reshape(T, cfg.n_head, cfg.head_dim)
    k = k.reshape(T, cfg.n_head_kv, cfg.head_dim)
    v = v.reshape(T, cfg.n_head_kv, cfg.v_head_dim)
    if cfg.qk_norm:
        q = ops.rms_norm(q, p + "attn_q_norm.weight", cfg.rms_eps)
        k = ops.rms_norm(k, p + "attn_k_norm.weight", cfg.rms_eps)
    base, scale = cfg.layer_rope_base(il), cfg.layer_rope_scale(il)
    q = ops.rope(q, pos0, base, cfg.rope_neox, cfg.rope_dim, scale)
    k = ops.rope(k, pos0, base, cfg.rope_neox, cfg.rope_dim, scale)
    o = ops.attention(kv, il, q, k, v, pos0, cfg.attn_scale, window)
    return linear_residual(ops, o, p + "attn_output.weight", residual)


def ffn_block(ops, cfg, il, h, kind="", residual=None):
    """Gated FFN over ffn_{gate,up,down}<kind>.weight (kind "_shexp": qwen2moe's shared expert),
    plus `residual` when one is given."""
    p = f"blk.{il}."
    # the activation folded into the product where the backend fuses them (CUDA decode)
    a = ops.linear_gated(h, [p + f"ffn_gate{kind}.weight", p + f"ffn_up{kind}.weight"], cfg.act)
    return linear_residual(ops, a, p + f"ffn_down{kind}.weight", residual)


def linear_residual(ops, x, name, residual):
    """x @ W.T, plus residual when given: one launch on backends that fold the add into the
    product (the CUDA one, for a decode token)."""
    if residual is None:
        return ops.linear(x, name)
    return ops.linear_add(x, name, residual)


def fold_residuals(ops, x):
    """Fold the residual adds into the products? For one token (decode), where each launch costs
    more than its bytes; a prefill chunk keeps add_rms_norm (one pass over the chunk fewer)."""
    return x.shape[0] == 1 and ops.folds_residuals


def forward_layer(ops, cfg, il, x, kv, pos0):
    p = f"blk.{il}."
    h = ops.rms_norm(x, p + "attn_norm.weight", cfg.rms_eps)
    if fold_residuals(ops, x):
        x = attention_block(ops, cfg, il, h, kv, pos0, residual=x)
        h = ops.rms_norm(x, p + "ffn_norm.weight", cfg.rms_eps)
        return ffn_block(ops, cfg, il, h, residual=x)
    # the residual add and the next norm: one launch on backends that fuse the two (the CUDA one)
    x, h = ops.add_rms_norm(x, attention_block(ops, cfg, il, h, kv, pos0), p + "ffn_norm.weight",
                            cfg.rms_eps)
    return ops.add(x, ffn_block(ops, cfg, il, h))
