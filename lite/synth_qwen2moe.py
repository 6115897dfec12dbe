"""qwen2moe's part of `lite synth` (lite.synth builds on it; kept apart to hold synth.py's size).

Layout from llama.cpp's src/models/qwen2moe.cpp (load_arch_tensors) and metadata keys from its
converter (Qwen2MoeModel.set_gguf_parameters): qwen2's attention, whose q and output are
(n_embd, n_embd) (llama.cpp requires n_head * head_dim == n_embd here, so no key_length is written),
with q/k/v biases; a router and 3-D experts as qwen3moe; and a shared expert, a gated FFN
ffn_{gate,up,down}_shexp of width expert_shared_feed_forward_length, whose output is scaled per
token by sigmoid(h . ffn_gate_inp_shexp), a vector of n_embd (F32, like the router).

This module imports nothing from lite.synth, so lite.synth can import it at the top.
"""

# Preset fields (lite.synth.Preset). The tiny one keeps rows multiples of 256 (K/IQ types fit),
# uses n_ff_shexp != n_ff != n_ff_exp so that reading the wrong width key cannot pass, and 2 of 16
# experts (many, few used, as Qwen's 4 of 60): the chosen softmax weights then sum to well under
# one, so renormalizing them (qwen3moe's rule, not qwen2moe's) moves the logits by ~0.04-0.09, beyond
# the 0.03 the llama.cpp comparison allows (4 of 8 moved them by only ~0.013).
PRESETS = {
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
BIAS_STD = 0.3


def layer_tensors(p, il, mat) -> list:
    """The tensors qwen2moe adds to a qwen3moe-like layer (no QK norms), made with plan()'s mat()."""
    b = f"blk.{il}."
    q_rows, kv_rows = p.n_head * p.head_dim, p.n_head_kv * p.head_dim
    f = p.n_ff_shexp
    return [mat(b + "attn_q.bias", (q_rows,), il, "F32", std=BIAS_STD),
            mat(b + "attn_k.bias", (kv_rows,), il, "F32", std=BIAS_STD),
            mat(b + "attn_v.bias", (kv_rows,), il, "F32", std=BIAS_STD),
            # a gate logit of std ~1 (h is RMS-normed), so sigmoid spans (0, 1) across tokens
            mat(b + "ffn_gate_inp_shexp.weight", (p.n_embd,), il, "F32", std=p.n_embd ** -0.5),
            mat(b + "ffn_gate_shexp.weight", (f, p.n_embd), il),
            mat(b + "ffn_down_shexp.weight", (p.n_embd, f), il),
            mat(b + "ffn_up_shexp.weight", (f, p.n_embd), il)]


def metadata(w, p):
    """The key the converter adds for qwen2moe beyond the MoE keys synth writes for every MoE."""
    w.add_expert_shared_feed_forward_length(p.n_ff_shexp)
