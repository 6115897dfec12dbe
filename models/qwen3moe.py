"""Qwen3-MoE: qwen3's attention (QK norm) and a mixture-of-experts FFN: a softmax router over all
experts, the top n_expert_used chosen, their weights renormalized to sum to one, each chosen expert a
SiLU-gated FFN. Expert tensors are 3-D: blk.N.ffn_{gate,up,down}_exps.weight (n_expert, rows, cols).
"""
from lite.models.llama import attention_block


def moe_block(ops, cfg, il, h):
    p = f"blk.{il}."
    ids, weights = ops.moe_route(h, p + "ffn_gate_inp.weight", cfg.n_expert_used, cfg.expert_weights_norm)
    return ops.moe_experts(h, il, ids, weights, cfg.act)


def forward_layer(ops, cfg, il, x, kv, pos0):
    p = f"blk.{il}."
    h = ops.rms_norm(x, p + "attn_norm.weight", cfg.rms_eps)
    x = ops.add(x, attention_block(ops, cfg, il, h, kv, pos0))
    h = ops.rms_norm(x, p + "ffn_norm.weight", cfg.rms_eps)
    return ops.add(x, moe_block(ops, cfg, il, h))
