"""qwen3next's part of `lite synth` (lite.synth builds on it; kept apart to hold synth.py's size).

Layout from llama.cpp's src/models/qwen3next.cpp (load_arch_tensors) and its converter
(Qwen3NextModel in conversion/qwen.py): every layer has attn_norm, post_attention_norm, a router,
3-D experts and a shared expert behind a sigmoid gate (ffn_gate_inp_shexp). Recurrent (Gated
DeltaNet) layers, all but every full_attention_interval-th: attn_qkv, attn_gate, ssm_ba,
ssm_conv1d (F32), ssm_a (-exp(A_log), negative), ssm_dt.bias, ssm_norm, ssm_out. Full-attention
layers: attn_q of twice the heads' width (query and output gate per head), attn_k, attn_v, per-head
q/k norms, attn_output. RoPE covers a quarter of the head (rope.dimension_count).

This module imports nothing from lite.synth, so lite.synth can import it at the top.
"""
from collections import namedtuple

# The Gated DeltaNet sizes of a preset: conv taps, key heads Hk, value heads Hv, head dims, and the
# layer pattern (every interval-th layer is full attention).
SSM = namedtuple("SSM", "conv_kernel k_heads v_heads k_dim v_dim full_attention_interval")

# Preset fields (lite.synth.Preset). Tiny keeps rows multiples of 256 (K/IQ types fit) and has both
# layer kinds in any split of its 4 layers into stages of 2 (interval 2); 80b-a3b is Qwen3-Next-80B-A3B.
PRESETS = {
    "tiny": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=600,
                 n_text=560, n_ctx=4096, rope_base=10000000.0, rms_eps=1e-6, n_expert=8,
                 n_expert_used=2, n_ff_exp=256, n_ff_shexp=512, write_head_dim=True,
                 ssm=SSM(4, 2, 4, 64, 64, 2)),
    "80b-a3b": dict(n_layer=48, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_ff=5120,
                    n_vocab=151936, n_text=151643, n_ctx=262144, rope_base=10000000.0, rms_eps=1e-6,
                    n_expert=512, n_expert_used=10, n_ff_exp=512, n_ff_shexp=512,
                    write_head_dim=True, ssm=SSM(4, 16, 32, 128, 128, 4)),
}


def is_recurrent(p, il):
    return (il + 1) % p.ssm.full_attention_interval != 0


def layer(p, il, mat, norm) -> list:
    """The tensors of layer il, made with plan()'s mat() and norm(), in llama.cpp's order."""
    b, E, s = f"blk.{il}.", p.n_embd, p.ssm
    specs = [norm(b + "attn_norm.weight", E, il)]
    if is_recurrent(p, il):
        C = 2 * s.k_heads * s.k_dim + s.v_heads * s.v_dim
        inner = s.v_heads * s.v_dim
        specs += [mat(b + "attn_qkv.weight", (C, E), il),
                  mat(b + "attn_gate.weight", (inner, E), il),
                  mat(b + "ssm_ba.weight", (2 * s.v_heads, E), il),
                  # taps of a conv over a few rows: wide enough to matter (the conv is not normed)
                  mat(b + "ssm_conv1d.weight", (C, s.conv_kernel), il, "F32", std=0.5),
                  # ssm_a is -exp(A_log) < 0: a constant decay rate keeps the state bounded
                  mat(b + "ssm_a", (s.v_heads,), il, "F32", fill=-1.0),
                  mat(b + "ssm_dt.bias", (s.v_heads,), il, "F32", std=0.5),
                  norm(b + "ssm_norm.weight", s.v_dim, il),
                  mat(b + "ssm_out.weight", (E, inner), il)]
    else:
        q_rows, kv_rows = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
        specs += [mat(b + "attn_q.weight", (2 * q_rows, E), il),
                  mat(b + "attn_k.weight", (kv_rows, E), il),
                  mat(b + "attn_v.weight", (kv_rows, E), il),
                  mat(b + "attn_output.weight", (E, q_rows), il),
                  norm(b + "attn_q_norm.weight", p.head_dim, il),
                  norm(b + "attn_k_norm.weight", p.head_dim, il)]
    e, f, fs = p.n_expert, p.n_ff_exp, p.n_ff_shexp
    specs += [norm(b + "post_attention_norm.weight", E, il),
              mat(b + "ffn_gate_inp.weight", (e, E), il, "F32", std=E ** -0.5),
              mat(b + "ffn_gate_exps.weight", (e, f, E), il),
              mat(b + "ffn_down_exps.weight", (e, E, f), il),
              mat(b + "ffn_up_exps.weight", (e, f, E), il),
              mat(b + "ffn_gate_inp_shexp.weight", (E,), il, "F32", std=E ** -0.5),
              mat(b + "ffn_gate_shexp.weight", (fs, E), il),
              mat(b + "ffn_down_shexp.weight", (E, fs), il),
              mat(b + "ffn_up_shexp.weight", (fs, E), il)]
    return specs


def metadata(w, p):
    """The keys the converter adds for qwen3next beyond those synth writes for every MoE."""
    s = p.ssm
    w.add_expert_shared_feed_forward_length(p.n_ff_shexp)
    w.add_ssm_conv_kernel(s.conv_kernel)
    w.add_ssm_state_size(s.k_dim)
    w.add_ssm_group_count(s.k_heads)
    w.add_ssm_time_step_rank(s.v_heads)
    w.add_ssm_inner_size(s.v_dim * s.v_heads)
    w.add_full_attention_interval(s.full_attention_interval)
    w.add_rope_dimension_count(p.head_dim // 4)       # partial_rotary_factor 0.25
