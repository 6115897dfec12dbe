"""Gemma 3: llama's attention with QK norm, plus norms after attention and after the FFN,
sliding-window layers with their own RoPE base, GeGLU, and the embedding scaled by sqrt(n_embd).
(GGUF stores Gemma's RMSNorm weights with the +1 already added.)
"""
from lite.models.llama import attention_block, ffn_block


def forward_layer(ops, cfg, il, x, kv, pos0):
    p = f"blk.{il}."
    window = cfg.sliding_window if cfg.is_swa_layer(il) else 0
    h = ops.rms_norm(x, p + "attn_norm.weight", cfg.rms_eps)
    a = attention_block(ops, cfg, il, h, kv, pos0, window)
    x = ops.add(x, ops.rms_norm(a, p + "post_attention_norm.weight", cfg.rms_eps))
    h = ops.rms_norm(x, p + "ffn_norm.weight", cfg.rms_eps)
    f = ffn_block(ops, cfg, il, h)
    return ops.add(x, ops.rms_norm(f, p + "post_ffw_norm.weight", cfg.rms_eps))
