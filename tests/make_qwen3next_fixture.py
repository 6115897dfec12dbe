"""Make the qwen3next reference fixture: a tiny random Qwen3Next from HF transformers, written to
GGUF with gguf-py in llama.cpp's layout, and transformers' float32 logits over a 150-token prompt.

    pip install torch==2.13.0 transformers        # CPU torch; only this script needs them
    python tests/make_qwen3next_fixture.py          # writes the two files below

tests/fixtures/qwen3next_tiny.gguf   the model (F16 matrices, F32 norms, router, conv and gates)
tests/fixtures/qwen3next_ref.npz     ids (150,), logits (150, n_vocab) f32, greedy (8,): the greedy
                                     continuation, each token by a full forward of the sequence so far

The second reference, llama.cpp (llama-cpp-python, which builds it from source; no torch needed):
    python tests/make_qwen3next_fixture.py --llamacpp
tests/fixtures/qwen3next_llamacpp.npz  llama.cpp's logits of every position of the same prompt over
                                     the same file, its greedy continuation, and the last position's
                                     logits of lite's tiny synth qwen3next file (SYNTH_CASE), which
                                     shows that llama.cpp loads what `lite synth` writes

The weights come from a NumPy generator seeded here (not torch's initialisation), are rounded to
f16 where the file stores f16, and transformers runs on exactly those values, so the reference is
the same math as lite's CPU path up to float32 rounding. Tensor names, the reordering of
in_proj_qkvz into attn_qkv + attn_gate, -exp(A_log), the +1 of the (1 + w) norms and the metadata
keys follow llama.cpp's converter (Qwen3NextModel in conversion/qwen.py); tests/test_qwen3next.py
also rebuilds the older fused ssm_in layout from this file.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
GGUF_PATH = os.path.join(HERE, "fixtures", "qwen3next_tiny.gguf")
REF_PATH = os.path.join(HERE, "fixtures", "qwen3next_ref.npz")
LLAMACPP_PATH = os.path.join(HERE, "fixtures", "qwen3next_llamacpp.npz")
SYNTH_CASE = ("tiny", "F16", 3)           # preset, quant, seed of the synth file llama.cpp runs
SEED = 29
N_PROMPT, N_GREEDY = 150, 8

# A tiny random qwen3next: hidden 64, 4 layers (full attention every 2nd), 2 key heads and
# 4 value heads for the delta rule, 8 experts of which 2 are used, a shared expert.
HP = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
          num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_conv_kernel_dim=4,
          linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
          linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
          num_experts_per_tok=2, num_experts=8, norm_topk_prob=True, full_attention_interval=2,
          max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
          rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
N_TEXT = 280          # ordinary BPE tokens of the synthetic tokenizer; special tokens follow


def random_state(sd, rng):
    """New values for every parameter: matrices with std 1/sqrt(fan_in) (activations of order 1),
    norms perturbed around their neutral value, decays and gates in their usual ranges."""
    out = {}
    for name, t in sd.items():
        shape = tuple(t.shape)
        if name.endswith("A_log"):
            x = np.log(rng.uniform(1.0, 8.0, shape))
        elif name.endswith("dt_bias"):
            x = rng.uniform(-1.0, 1.0, shape)
        elif name.endswith("linear_attn.norm.weight"):           # a plain weight (ones at init)
            x = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith("norm.weight"):                       # (1 + w) norms: zero at init
            x = 0.2 * rng.standard_normal(shape)
        elif name.endswith("conv1d.weight"):
            x = rng.standard_normal(shape) / np.sqrt(shape[-1])
        elif "embed_tokens" in name:
            x = rng.standard_normal(shape)
        else:
            x = rng.standard_normal(shape) / np.sqrt(shape[-1])
        out[name] = x.astype(np.float32)
    return out


def gguf_tensors(st):
    """{gguf name: numpy array (f32 or f16)} in llama.cpp's qwen3next layout."""
    hk, hv = HP["linear_num_key_heads"], HP["linear_num_value_heads"]
    dk, dv, E = HP["linear_key_head_dim"], HP["linear_value_head_dim"], HP["hidden_size"]
    f16 = lambda x: x.astype(np.float16)          # noqa: E731
    t = {"token_embd.weight": f16(st["model.embed_tokens.weight"]),
         "output_norm.weight": st["model.norm.weight"] + 1.0,
         "output.weight": f16(st["lm_head.weight"])}
    for il in range(HP["num_hidden_layers"]):
        p, b = f"model.layers.{il}.", f"blk.{il}."
        t[b + "attn_norm.weight"] = st[p + "input_layernorm.weight"] + 1.0
        t[b + "post_attention_norm.weight"] = st[p + "post_attention_layernorm.weight"] + 1.0
        if p + "linear_attn.A_log" in st:
            la = p + "linear_attn."
            w = st[la + "in_proj_qkvz.weight"].reshape(hk, 2 * dk + 2 * hv // hk * dv, E)
            rv = hv // hk * dv
            q, k, v, z = (w[:, :dk], w[:, dk:2 * dk], w[:, 2 * dk:2 * dk + rv], w[:, 2 * dk + rv:])
            t[b + "attn_qkv.weight"] = f16(np.concatenate([x.reshape(-1, E) for x in (q, k, v)]))
            t[b + "attn_gate.weight"] = f16(z.reshape(-1, E))
            t[b + "ssm_ba.weight"] = f16(st[la + "in_proj_ba.weight"])
            t[b + "ssm_conv1d.weight"] = st[la + "conv1d.weight"].reshape(-1, HP["linear_conv_kernel_dim"])
            t[b + "ssm_a"] = -np.exp(st[la + "A_log"])
            t[b + "ssm_dt.bias"] = st[la + "dt_bias"]
            t[b + "ssm_norm.weight"] = st[la + "norm.weight"]
            t[b + "ssm_out.weight"] = f16(st[la + "out_proj.weight"])
        else:
            sa = p + "self_attn."
            for hf, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                          ("o_proj", "attn_output")):
                t[b + g + ".weight"] = f16(st[sa + hf + ".weight"])
            t[b + "attn_q_norm.weight"] = st[sa + "q_norm.weight"] + 1.0
            t[b + "attn_k_norm.weight"] = st[sa + "k_norm.weight"] + 1.0
        m, f = p + "mlp.", HP["moe_intermediate_size"]
        t[b + "ffn_gate_inp.weight"] = st[m + "gate.weight"]
        gu = st[m + "experts.gate_up_proj"]                       # (n_expert, 2 f, E): [gate | up]
        t[b + "ffn_gate_exps.weight"] = f16(gu[:, :f])
        t[b + "ffn_up_exps.weight"] = f16(gu[:, f:])
        t[b + "ffn_down_exps.weight"] = f16(st[m + "experts.down_proj"])
        t[b + "ffn_gate_inp_shexp.weight"] = st[m + "shared_expert_gate.weight"].reshape(-1)
        for hf, g in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"),
                      ("down_proj", "ffn_down_shexp")):
            t[b + g + ".weight"] = f16(st[m + "shared_expert." + hf + ".weight"])
    return t


def hf_state(st, tensors):
    """The HF parameters as the GGUF file holds them (f16-rounded where it stores f16)."""
    out = dict(st)
    r = lambda x: x.astype(np.float16).astype(np.float32)      # noqa: E731
    for name, x in st.items():
        if x.ndim >= 2 and "conv1d" not in name and not name.endswith("mlp.gate.weight") \
                and not name.endswith("shared_expert_gate.weight"):
            out[name] = r(x)
    return out


def write_gguf(path, tensors):
    from gguf import GGUFWriter

    from lite.files.synth import Preset
    from lite.files.synth_vocab import vocab
    arch = "qwen3next"
    w = GGUFWriter(path, arch)
    w.add_type("model")
    w.add_name("qwen3next tiny random (tests/make_qwen3next_fixture.py)")
    w.add_block_count(HP["num_hidden_layers"])
    w.add_context_length(HP["max_position_embeddings"])
    w.add_embedding_length(HP["hidden_size"])
    w.add_feed_forward_length(HP["intermediate_size"])
    w.add_head_count(HP["num_attention_heads"])
    w.add_head_count_kv(HP["num_key_value_heads"])
    w.add_rope_freq_base(HP["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(HP["rms_norm_eps"])
    w.add_expert_count(HP["num_experts"])
    w.add_expert_used_count(HP["num_experts_per_tok"])
    w.add_key_length(HP["head_dim"])
    w.add_value_length(HP["head_dim"])
    w.add_expert_feed_forward_length(HP["moe_intermediate_size"])
    w.add_expert_shared_feed_forward_length(HP["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(HP["linear_conv_kernel_dim"])
    w.add_ssm_state_size(HP["linear_key_head_dim"])
    w.add_ssm_group_count(HP["linear_num_key_heads"])
    w.add_ssm_time_step_rank(HP["linear_num_value_heads"])
    w.add_ssm_inner_size(HP["linear_value_head_dim"] * HP["linear_num_value_heads"])
    w.add_full_attention_interval(HP["full_attention_interval"])
    w.add_rope_dimension_count(int(HP["head_dim"] * HP["rope_parameters"]["partial_rotary_factor"]))
    w.add_file_type(1)                                            # MOSTLY_F16
    p = Preset(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=96,
               n_vocab=HP["vocab_size"], n_text=N_TEXT, n_ctx=4096, rope_base=1e4, rms_eps=1e-6)
    v = vocab(arch, p)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v["pre"])
    w.add_token_list(v["tokens"])
    w.add_token_types([int(x) for x in v["types"]])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    w.add_add_bos_token(v["add_bos"])
    for name, x in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    torch.manual_seed(SEED)
    model = Qwen3NextForCausalLM(Qwen3NextConfig(**HP)).float().eval()
    rng = np.random.default_rng(SEED)
    st = random_state({k: v for k, v in model.state_dict().items()}, rng)
    tensors = gguf_tensors(st)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in hf_state(st, tensors).items()})
    ids = rng.integers(0, N_TEXT, N_PROMPT).astype(np.int64)
    with torch.no_grad():
        logits = model(torch.from_numpy(ids)[None], use_cache=False).logits[0].float().numpy()
        seq, greedy = list(ids), []
        for _ in range(N_GREEDY):             # full forwards: no cache continuation involved
            nxt = int(model(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
            greedy.append(nxt)
            seq.append(nxt)
    os.makedirs(os.path.dirname(GGUF_PATH), exist_ok=True)
    write_gguf(GGUF_PATH, tensors)
    np.savez_compressed(REF_PATH, ids=ids.astype(np.int32), logits=logits.astype(np.float32),
                        greedy=np.array(greedy, np.int32))
    print(f"wrote {GGUF_PATH} ({os.path.getsize(GGUF_PATH):,d} bytes), {REF_PATH} "
          f"({os.path.getsize(REF_PATH):,d} bytes); greedy {greedy}")


def llamacpp_logits(path, ids, n_greedy, threads=2):
    """llama.cpp's logits of every position of ids (one batch), and its greedy continuation."""
    import llama_cpp
    llm = llama_cpp.Llama(path, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=threads,
                          n_threads_batch=threads, n_gpu_layers=0, logits_all=True, verbose=False)
    n_vocab = llm.n_vocab()
    llm.eval([int(i) for i in ids])
    logits = np.array(llm.scores[:len(ids)], np.float32).reshape(len(ids), n_vocab)
    greedy, last = [], logits[-1]
    for _ in range(n_greedy):
        greedy.append(int(np.argmax(last)))
        llm.eval([greedy[-1]])
        last = np.array(llm.scores[llm.n_tokens - 1], np.float32)
    return logits, np.array(greedy, np.int32)


def main_llamacpp():
    import tempfile

    from lite.files.synth import synth
    ids = np.load(REF_PATH)["ids"]
    logits, greedy = llamacpp_logits(GGUF_PATH, ids, N_GREEDY)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "synth.gguf")
        preset, quant, seed = SYNTH_CASE
        synth("qwen3next", preset, quant, path, seed=seed)
        synth_logits, _ = llamacpp_logits(path, ids[:40], 0)
    np.savez_compressed(LLAMACPP_PATH, ids=ids, logits=logits, greedy=greedy,
                        synth_ids=ids[:40], synth_last=synth_logits[-1])
    print(f"wrote {LLAMACPP_PATH} ({os.path.getsize(LLAMACPP_PATH):,d} bytes); greedy {list(greedy)}")


if __name__ == "__main__":
    main_llamacpp() if "--llamacpp" in sys.argv[1:] else main()
