"""gemma3's part of `lite synth` (lite.synth builds on it; kept apart to hold synth.py's size).

Layout as the Gemma 3 270M file lite's tests fetch (gemma-3-270m-q4_k_m.gguf, written by llama.cpp's
converter) has it: llama's attention with per-head q/k RMSNorms, a norm after attention
(post_attention_norm) and after the FFN (post_ffw_norm) besides the two before them, a GELU-gated
FFN, and no output.weight (the output is tied to token_embd). head_dim (key_length 256) is not
n_embd / n_head, so key_length and value_length are written; attention.sliding_window is the local
layers' window (every 6th layer attends globally, llama.cpp's gemma3 pattern). GGUF stores Gemma's
norm weights with the +1 already added, so norms of 1.0 are plain.

What synth gives a gemma3 file that no other arch does: head dim 256 (the decode attention's v1/v2
limit), GELU in the gated product, sliding-window layers and their own RoPE base.
This module imports nothing from lite.synth, so lite.synth can import it at the top.
"""

# Preset fields (lite.synth.Preset). Tiny: 7 layers, so that layer 5 is global and the others local;
# a window of 16 tokens, shorter than the tests' prompts; rows multiples of 256 (K types fit).
PRESETS = {
    "tiny": dict(n_layer=7, n_embd=256, n_head=2, n_head_kv=1, head_dim=256, n_ff=512, n_vocab=600,
                 n_text=560, n_ctx=4096, rope_base=1000000.0, rms_eps=1e-6, write_head_dim=True,
                 sliding_window=16),
}


def post_norms(il, norm, n_embd) -> list:
    """The two norms gemma3 adds to a layer, made with plan()'s norm()."""
    b = f"blk.{il}."
    return [norm(b + "post_attention_norm.weight", n_embd, il),
            norm(b + "post_ffw_norm.weight", n_embd, il)]


def metadata(w, p):
    """The key the converter adds for gemma3 beyond those synth writes for every arch."""
    w.add_sliding_window(p.sliding_window)
