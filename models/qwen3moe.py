"""Qwen3-MoE and Qwen2-MoE: a mixture-of-experts FFN: a softmax router over all experts, the top
n_expert_used chosen, each chosen expert a SiLU-gated FFN. Expert tensors are 3-D:
blk.N.ffn_{gate,up,down}_exps.weight (n_expert, rows, cols).

qwen3moe: qwen3's attention (QK norm); the top-k weights renormalized to sum to one.
qwen2moe: qwen2's attention (q/k/v biases, which linear adds); the top-k weights as the softmax gave
them (cfg.expert_weights_norm False); plus a shared expert every token goes through, a gated FFN
over ffn_{gate,up,down}_shexp.weight scaled per token by sigmoid(h . ffn_gate_inp_shexp.weight).
"""
from lite.models.llama import attention_block, ffn_block, fold_residuals


def moe_block(ops, cfg, il, h, residual=None):
    """The MoE FFN of pre-normed h, plus `residual` when given (inside the experts' combine on
    backends that take it there: the CUDA one, moe_residual)."""
    p = f"blk.{il}."
    ids, weights = ops.moe_route(h, p + "ffn_gate_inp.weight", cfg.n_expert_used, cfg.expert_weights_norm)
    if residual is not None and not cfg.n_ff_shexp and ops.moe_residual:
        return ops.moe_experts(h, il, ids, weights, cfg.act, residual=residual)
    out = ops.moe_experts(h, il, ids, weights, cfg.act)
    if cfg.n_ff_shexp:
        shared = ffn_block(ops, cfg, il, h, "_shexp")
        out = ops.add_sigmoid_gated(out, shared, h, p + "ffn_gate_inp_shexp.weight")
    return out if residual is None else ops.add(residual, out)


def forward_layer(ops, cfg, il, x, kv, pos0):
    p = f"blk.{il}."
    h = ops.rms_norm(x, p + "attn_norm.weight", cfg.rms_eps)
    if fold_residuals(ops, x):
        x = attention_block(ops, cfg, il, h, kv, pos0, residual=x)
    else:
        x = ops.add(x, attention_block(ops, cfg, il, h, kv, pos0))
    h = ops.rms_norm(x, p + "ffn_norm.weight", cfg.rms_eps)
    return moe_block(ops, cfg, il, h, residual=x)
