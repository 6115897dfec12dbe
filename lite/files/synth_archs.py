"""The parts of `lite synth` that only one architecture has (lite.files.synth builds on them; apart from
synth.py to hold its size). Each section names its source in llama.cpp; this module imports nothing
from lite.files.synth, so lite.files.synth can import it at the top."""
from collections import namedtuple

# --- gemma3 ------------------------------------------------------------------------------------
# Layout as the Gemma 3 270M file lite's tests fetch (gemma-3-270m-q4_k_m.gguf, written by llama.cpp's
# converter) has it: llama's attention with per-head q/k RMSNorms, a norm after attention
# (post_attention_norm) and after the FFN (post_ffw_norm) besides the two before them, a GELU-gated
# FFN, and no output.weight (the output is tied to token_embd). head_dim (key_length 256) is not
# n_embd / n_head, so key_length and value_length are written; attention.sliding_window is the local
# layers' window (every 6th layer attends globally, llama.cpp's gemma3 pattern). GGUF stores Gemma's
# norm weights with the +1 already added, so norms of 1.0 are plain.
#
# What synth gives a gemma3 file that no other arch does: head dim 256 (the decode attention's v1/v2
# limit), GELU in the gated product, sliding-window layers and their own RoPE base.

# Preset fields (lite.files.synth.Preset). Tiny: 7 layers, so that layer 5 is global and the others local;
# a window of 16 tokens, shorter than the tests' prompts; rows multiples of 256 (K types fit).
GEMMA3_PRESETS = {
    "tiny": dict(n_layer=7, n_embd=256, n_head=2, n_head_kv=1, head_dim=256, n_ff=512, n_vocab=600,
                 n_text=560, n_ctx=4096, rope_base=1000000.0, rms_eps=1e-6, write_head_dim=True,
                 sliding_window=16),
}


def gemma3_post_norms(il, norm, n_embd) -> list:
    """The two norms gemma3 adds to a layer, made with plan()'s norm()."""
    b = f"blk.{il}."
    return [norm(b + "post_attention_norm.weight", n_embd, il),
            norm(b + "post_ffw_norm.weight", n_embd, il)]


def gemma3_metadata(w, p):
    """The key the converter adds for gemma3 beyond those synth writes for every arch."""
    w.add_sliding_window(p.sliding_window)


# --- qwen2moe ----------------------------------------------------------------------------------
# Layout from llama.cpp's src/models/qwen2moe.cpp (load_arch_tensors) and metadata keys from its
# converter (Qwen2MoeModel.set_gguf_parameters): qwen2's attention, whose q and output are
# (n_embd, n_embd) (llama.cpp requires n_head * head_dim == n_embd here, so no key_length is written),
# with q/k/v biases; a router and 3-D experts as qwen3moe; and a shared expert, a gated FFN
# ffn_{gate,up,down}_shexp of width expert_shared_feed_forward_length, whose output is scaled per
# token by sigmoid(h . ffn_gate_inp_shexp), a vector of n_embd (F32, like the router).
# Preset fields (lite.files.synth.Preset). The tiny one keeps rows multiples of 256 (K/IQ types fit),
# uses n_ff_shexp != n_ff != n_ff_exp so that reading the wrong width key cannot pass, and 2 of 16
# experts (many, few used, as Qwen's 4 of 60): the chosen softmax weights then sum to well under
# one, so renormalizing them (qwen3moe's rule, not qwen2moe's) moves the logits by ~0.04-0.09, beyond
# the 0.03 the llama.cpp comparison allows (4 of 8 moved them by only ~0.013).
QWEN2MOE_PRESETS = {
    "tiny": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=1024, n_vocab=600,
                 n_text=560, n_ctx=4096, rope_base=1000000.0, rms_eps=1e-6, n_expert=16,
                 n_expert_used=2, n_ff_exp=512, n_ff_shexp=768),
    # Qwen1.5-MoE-A2.7B. Its expert width 1408 is no multiple of 256: K and IQ types cannot hold
    # ffn_down_exps rows (llama-quantize falls back for them), so this preset takes Q8_0, Q4_0 ...
    "a2.7b": dict(n_layer=24, n_embd=2048, n_head=16, n_head_kv=16, head_dim=128, n_ff=5632,
                  n_vocab=151936, n_text=151643, n_ctx=8192, rope_base=1000000.0, rms_eps=1e-6,
                  n_expert=60, n_expert_used=4, n_ff_exp=1408, n_ff_shexp=5632),
}

# Attention biases: wider than the weights (std 0.02) so that they move q, k and v visibly, as
# Qwen2's trained biases do; a bias left out by a forward then changes the logits.
QWEN2MOE_BIAS_STD = 0.3


def qwen2moe_layer_tensors(p, il, mat) -> list:
    """The tensors qwen2moe adds to a qwen3moe-like layer (no QK norms), made with plan()'s mat()."""
    b = f"blk.{il}."
    q_rows, kv_rows = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    f = p.n_ff_shexp
    return [mat(b + "attn_q.bias", (q_rows,), il, "F32", std=QWEN2MOE_BIAS_STD),
            mat(b + "attn_k.bias", (kv_rows,), il, "F32", std=QWEN2MOE_BIAS_STD),
            mat(b + "attn_v.bias", (kv_rows,), il, "F32", std=QWEN2MOE_BIAS_STD),
            # a gate logit of std ~1 (h is RMS-normed), so sigmoid spans (0, 1) across tokens
            mat(b + "ffn_gate_inp_shexp.weight", (p.n_embd,), il, "F32", std=p.n_embd ** -0.5),
            mat(b + "ffn_gate_shexp.weight", (f, p.n_embd), il),
            mat(b + "ffn_down_shexp.weight", (p.n_embd, f), il),
            mat(b + "ffn_up_shexp.weight", (f, p.n_embd), il)]


def qwen2moe_metadata(w, p):
    """The key the converter adds for qwen2moe beyond the MoE keys synth writes for every MoE."""
    w.add_expert_shared_feed_forward_length(p.n_ff_shexp)


# --- qwen3next ---------------------------------------------------------------------------------
# Layout from llama.cpp's src/models/qwen3next.cpp (load_arch_tensors) and its converter
# (Qwen3NextModel in conversion/qwen.py): every layer has attn_norm, post_attention_norm, a router,
# 3-D experts and a shared expert behind a sigmoid gate (ffn_gate_inp_shexp). Recurrent (Gated
# DeltaNet) layers, all but every full_attention_interval-th: attn_qkv, attn_gate, ssm_ba,
# ssm_conv1d (F32), ssm_a (-exp(A_log), negative), ssm_dt.bias, ssm_norm, ssm_out. Full-attention
# layers: attn_q of twice the heads' width (query and output gate per head), attn_k, attn_v, per-head
# q/k norms, attn_output. RoPE covers a quarter of the head (rope.dimension_count).
# The Gated DeltaNet sizes of a preset: conv taps, key heads Hk, value heads Hv, head dims, and the
# qwen3next_layer pattern (every interval-th qwen3next_layer is full attention).
SSM = namedtuple("SSM", "conv_kernel k_heads v_heads k_dim v_dim full_attention_interval")

# Preset fields (lite.files.synth.Preset). Tiny keeps rows multiples of 256 (K/IQ types fit) and has both
# qwen3next_layer kinds in any split of its 4 layers into stages of 2 (interval 2); 80b-a3b is Qwen3-Next-80B-A3B.
QWEN3NEXT_PRESETS = {
    "tiny": dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=600,
                 n_text=560, n_ctx=4096, rope_base=10000000.0, rms_eps=1e-6, n_expert=8,
                 n_expert_used=2, n_ff_exp=256, n_ff_shexp=512, write_head_dim=True,
                 ssm=SSM(4, 2, 4, 64, 64, 2)),
    "80b-a3b": dict(n_layer=48, n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_ff=5120,
                    n_vocab=151936, n_text=151643, n_ctx=262144, rope_base=10000000.0, rms_eps=1e-6,
                    n_expert=512, n_expert_used=10, n_ff_exp=512, n_ff_shexp=512,
                    write_head_dim=True, ssm=SSM(4, 16, 32, 128, 128, 4)),
}


def qwen3next_is_recurrent(p, il):
    return (il + 1) % p.ssm.full_attention_interval != 0


def qwen3next_layer(p, il, mat, norm) -> list:
    """The tensors of qwen3next_layer il, made with plan()'s mat() and norm(), in llama.cpp's order."""
    b, E, s = f"blk.{il}.", p.n_embd, p.ssm
    specs = [norm(b + "attn_norm.weight", E, il)]
    if qwen3next_is_recurrent(p, il):
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


def qwen3next_metadata(w, p):
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
