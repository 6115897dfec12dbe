"""lite synth: random-weight GGUF files in llama.cpp's layouts.

The expected layouts below are written from llama.cpp's tensor naming (llama-arch.cpp, the
create_tensor calls of src/models/{llama,qwen3,qwen3moe}.cpp, shapes there in ggml order {ne0, ne1}
reversed here to numpy order) and from the presets' numbers in the brief, not from lite/synth.py.
"""
import hashlib
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType as QT

from cli.synth import synth as synth_cmd
from lite.config import ModelConfig
from lite.gguf_file import GGUFFile
from lite.synth import QUANT_TYPES, SynthError, TensorSpec, plan, synth, tensor_bytes

HERE = os.path.dirname(__file__)
ARCHS = ("llama", "qwen3", "qwen3moe")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The three tiny files at Q4_K, seed 0, written once for the module."""
    d = tmp_path_factory.mktemp("synth")
    return {a: synth(a, "tiny", "Q4_K", d / f"{a}.gguf", seed=0)["path"] for a in ARCHS}


def _table(path):
    f = GGUFFile(path)
    return {n: (t.shape, t.type_name) for n, t in f.tensors.items()}


def test_tiny_llama_layout_matches_llama_cpp_names(tiny):
    # llama tiny: 4 layers, n_embd 256, 4 heads of 64, 2 KV heads, ffn 512, vocab 512
    want = {"token_embd.weight": ((512, 256), "Q6_K"), "output_norm.weight": ((256,), "F32"),
            "output.weight": ((512, 256), "Q6_K")}
    for i in range(4):
        want.update({
            f"blk.{i}.attn_norm.weight": ((256,), "F32"),
            f"blk.{i}.attn_q.weight": ((256, 256), "Q4_K"),
            f"blk.{i}.attn_k.weight": ((128, 256), "Q4_K"),
            f"blk.{i}.attn_v.weight": ((128, 256), "Q4_K"),
            f"blk.{i}.attn_output.weight": ((256, 256), "Q4_K"),
            f"blk.{i}.ffn_norm.weight": ((256,), "F32"),
            f"blk.{i}.ffn_gate.weight": ((512, 256), "Q4_K"),
            f"blk.{i}.ffn_up.weight": ((512, 256), "Q4_K"),
            f"blk.{i}.ffn_down.weight": ((256, 512), "Q4_K"),
        })
    assert _table(tiny["llama"]) == want     # Llama 3.0: no rope_freqs.weight


def test_tiny_qwen3moe_layout_matches_llama_cpp_names(tiny):
    # qwen3moe tiny: n_embd 256, 4 heads x 128 (q 512 rows), 2 KV heads, 8 experts of ffn 512
    got = _table(tiny["qwen3moe"])
    assert len(got) == 3 + 4 * 12
    for i in range(4):
        b = f"blk.{i}."
        assert got[b + "attn_q.weight"] == ((512, 256), "Q4_K")
        assert got[b + "attn_k.weight"] == ((256, 256), "Q4_K")
        assert got[b + "attn_output.weight"] == ((256, 512), "Q4_K")
        assert got[b + "attn_q_norm.weight"] == ((128,), "F32")
        assert got[b + "attn_k_norm.weight"] == ((128,), "F32")
        assert got[b + "ffn_gate_inp.weight"] == ((8, 256), "F32")
        assert got[b + "ffn_gate_exps.weight"] == ((8, 512, 256), "Q4_K")
        assert got[b + "ffn_up_exps.weight"] == ((8, 512, 256), "Q4_K")
        assert got[b + "ffn_down_exps.weight"] == ((8, 256, 512), "Q4_K")
        assert b + "ffn_gate.weight" not in got


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_file_matches_plan_and_config(tiny, arch):
    f = GGUFFile(tiny[arch])
    specs = plan(arch, "tiny", "Q4_K")
    assert list(f.tensors) == [s.name for s in specs]        # file order is plan order
    for s in specs:
        t = f.tensors[s.name]
        assert (t.shape, t.type_name, t.nbytes) == (s.shape, s.qtype, s.nbytes)
    cfg = ModelConfig.from_gguf(f.metadata)
    md = f.metadata
    assert (cfg.arch, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv) == (arch, 4, 256, 4, 2)
    assert cfg.n_vocab == len(md["tokenizer.ggml.tokens"]) == f.tensors["token_embd.weight"].shape[0]
    if arch == "llama":
        assert (cfg.head_dim, cfg.rope_base, cfg.n_ff) == (64, 500000.0, 512)
        assert cfg.rms_eps == pytest.approx(1e-5)     # stored as f32
        assert md["llama.vocab_size"] == 512 and md["llama.rope.dimension_count"] == 64
        assert "llama.attention.key_length" not in md     # Llama 3's config has no head_dim
    else:
        assert (cfg.head_dim, cfg.rope_base, cfg.qk_norm) == (128, 1e6, True)
        assert md[f"{arch}.attention.key_length"] == md[f"{arch}.attention.value_length"] == 128
    if arch == "qwen3moe":
        assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_expert) == (8, 2, 512)


@pytest.mark.parametrize("arch", ARCHS)
def test_tokenizer_metadata_is_consistent(tiny, arch):
    md = GGUFFile(tiny[arch]).metadata
    toks, types, merges = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"], \
        md["tokenizer.ggml.merges"]
    assert md["tokenizer.ggml.model"] == "gpt2"
    assert md["tokenizer.ggml.pre"] == ("llama-bpe" if arch == "llama" else "qwen2")
    assert len(types) == len(toks) and len(set(toks)) == len(toks)
    index = {t: i for i, t in enumerate(toks)}
    # GPT-2 byte-to-unicode: printable bytes stand for themselves, space is 'Ġ', newline 'Ċ'
    for ch in ["A", "!", "~", "Ġ", "Ċ", "ĉ", "ÿ"]:
        assert types[index[ch]] == 1
    assert sum(1 for t in toks if len(t) == 1 and types[index[t]] == 1) >= 256
    for m in merges:
        a, b = m.split(" ")
        assert a in index and b in index and a + b in index and index[a + b] > max(index[a], index[b])
    bos, eos = md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"]
    if arch == "llama":
        assert (toks[bos], toks[eos], md["tokenizer.ggml.add_bos_token"]) == \
            ("<|begin_of_text|>", "<|eot_id|>", True)
    else:
        assert (toks[bos], toks[eos], md["tokenizer.ggml.add_bos_token"]) == \
            ("<|endoftext|>", "<|im_end|>", False)
        assert toks[-1].startswith("[PAD") and types[-1] == 5
    assert types[eos] == 3


def test_8b_plan_without_writing():
    specs = plan("llama", "8b", "Q4_K")
    assert len(specs) == 2 + 32 * 9 + 1
    names = {s.name: s for s in specs}
    assert names["blk.31.attn_k.weight"].shape == (1024, 4096)
    assert names["blk.0.ffn_down.weight"].shape == (4096, 14336)
    assert (names["token_embd.weight"].shape, names["token_embd.weight"].qtype) == ((128256, 4096), "Q6_K")
    assert "rope_freqs.weight" not in names
    # Q4_K: 144 bytes per 256 values, Q6_K: 210; per layer q, o 4096x4096, k, v 1024x4096, 3 ffn 14336x4096
    layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096
    want = 32 * (layer // 256 * 144 + 2 * 4096 * 4) + 2 * 128256 * 4096 // 256 * 210 + 4096 * 4
    assert sum(s.nbytes for s in specs) == want == 4_788_813_824


def test_30b_a3b_plan_without_writing():
    specs = {s.name: s for s in plan("qwen3moe", "30b-a3b", "Q4_K")}
    assert len(specs) == 3 + 48 * 12
    assert specs["blk.47.ffn_down_exps.weight"].shape == (128, 2048, 768)
    assert specs["blk.0.ffn_gate_exps.weight"].shape == (128, 768, 2048)
    assert (specs["blk.0.ffn_gate_inp.weight"].shape, specs["blk.0.ffn_gate_inp.weight"].qtype) == \
        ((128, 2048), "F32")
    assert specs["blk.0.attn_q.weight"].shape == (4096, 2048)
    layer_q4 = 2 * 4096 * 2048 + 2 * 512 * 2048 + 3 * 128 * 768 * 2048
    want = 48 * (layer_q4 // 256 * 144 + 128 * 2048 * 4 + 2 * 2048 * 4 + 2 * 128 * 4) \
        + 2 * 151936 * 2048 // 256 * 210 + 2048 * 4
    assert sum(s.nbytes for s in specs.values()) == want


@pytest.mark.parametrize("qtype", [q for q in QUANT_TYPES if q != "F32"])
def test_weights_dequantize_to_small_finite_noise(qtype):
    spec = TensorSpec("blk.0.attn_q.weight", (32, 1024), qtype)
    raw = tensor_bytes(spec, seed=3).view(np.uint8)
    assert raw.nbytes == spec.nbytes
    w = gguf_quants.dequantize(raw.reshape(32, -1), QT[qtype])     # gguf-py's reference
    assert np.isfinite(w).all()
    assert 0.015 < w.std() < 0.025 and abs(w.mean()) < 0.004


def test_norms_are_one_and_file_is_deterministic(tiny, tmp_path):
    f = GGUFFile(tiny["qwen3moe"])
    for name in ("blk.0.attn_norm.weight", "blk.3.attn_k_norm.weight", "output_norm.weight"):
        assert (f.tensors[name].raw.view(np.float32) == 1.0).all()
    again = synth("qwen3moe", "tiny", "Q4_K", tmp_path / "a.gguf", seed=0)["path"]
    other = synth("qwen3moe", "tiny", "Q4_K", tmp_path / "b.gguf", seed=1)["path"]
    digest = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()  # noqa: E731
    assert digest(again) == digest(tiny["qwen3moe"]) != digest(other)
    assert not os.path.exists(str(again) + ".part")


@pytest.mark.parametrize("arch", ARCHS)
def test_lite_cpu_forward_gives_finite_spread_logits(tiny, arch):
    from lite.engine import Engine
    eng = Engine(tiny[arch], device="cpu", max_context=64)
    logits = eng.prefill([5, 300, 17, 45, 256, 400, 1, 99, 128, 270, 77, 12])
    assert logits.shape == (eng.cfg.n_vocab,) and np.isfinite(logits).all()
    assert 0.05 < logits.std() < 20


def test_bad_arguments_raise_clear_errors(tmp_path):
    with pytest.raises(SynthError, match="unknown architecture"):
        plan("gpt5", "tiny", "Q4_K")
    with pytest.raises(SynthError, match="unknown preset 'huge' for llama; choose one of tiny, small, 8b"):
        plan("llama", "huge", "Q4_K")
    with pytest.raises(SynthError, match="unsupported quant type 'Q9_K'"):
        plan("llama", "tiny", "Q9_K")
    with pytest.raises(SynthError, match="does not exist"):
        synth("llama", "tiny", "Q4_K", tmp_path / "no" / "x.gguf")
    with pytest.raises(SynthError, match="is a directory"):
        synth("llama", "tiny", "Q4_K", tmp_path)
    with pytest.raises(SynthError, match="seed"):
        synth("llama", "tiny", "Q4_K", tmp_path / "x.gguf", seed=-1)


def test_cli(tmp_path):
    r = CliRunner().invoke(synth_cmd, ["--arch", "llama", "--preset", "8b", "--plan"])
    assert r.exit_code == 0 and "291 tensors, 4,788,813,824 bytes" in r.output
    out = tmp_path / "t.gguf"
    r = CliRunner().invoke(synth_cmd, ["--arch", "qwen3", "--preset", "tiny", "--quant", "q8_0",
                                       "--seed", "7", str(out)])
    assert r.exit_code == 0, r.output
    assert GGUFFile(out).tensors["blk.2.ffn_up.weight"].type_name == "Q8_0"
    r = CliRunner().invoke(synth_cmd, ["--arch", "qwen3", "--preset", "tiny"])
    assert r.exit_code != 0 and "OUT.gguf" in r.output


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_matches_this_synth_and_lite_tokenizer(tiny, arch, tmp_path):
    """The llama.cpp fixture was made from the file synth writes now, and lite tokenizes its text alike."""
    path = os.path.join(HERE, "fixtures", f"synth_{arch}.json")
    if not os.path.exists(path):
        pytest.skip(f"{path} not made yet (tests/make_synth_fixtures.py)")
    fx = json.load(open(path))
    f = synth(arch, fx["preset"], fx["quant"], tmp_path / "f.gguf", seed=fx["seed"])["path"]
    assert hashlib.sha256(open(f, "rb").read()).hexdigest() == fx["file_sha256"], \
        "synth's output changed: rerun tests/make_synth_fixtures.py"
    from lite.tokenizer import Tokenizer
    tok = Tokenizer.from_metadata(GGUFFile(f).metadata)
    assert tok.encode(fx["text"]) == fx["text_ids"]
    assert len(fx["token_ids"]) == 12 and len(fx["top_ids"]) == 10 and len(fx["greedy"]) == 8


def test_tiny_gemma3_has_the_real_files_layout(tmp_path):
    """A layer's tensors are those of the Gemma 3 270M file (its names, written down from that file:
    q/k norms of head_dim, post norms), the output is tied (no output.weight), the config reads it
    as gemma3 with head dim 256, a window of 16 and layer 5 global; the CPU forward past the window
    gives finite, spread logits."""
    from lite.engine import Engine
    path = synth("gemma3", "tiny", "Q4_K", tmp_path / "g.gguf", seed=0)["path"]
    got = _table(path)
    layer = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
             "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"}
    assert {n[len("blk.0."):-len(".weight")] for n in got if n.startswith("blk.0.")} == layer
    assert set(got) - {n for n in got if n.startswith("blk.")} == {"token_embd.weight", "output_norm.weight"}
    assert got["blk.0.attn_q.weight"] == ((512, 256), "Q4_K") and got["blk.0.attn_k.weight"] == ((256, 256), "Q4_K")
    assert got["blk.0.attn_output.weight"] == ((256, 512), "Q4_K")
    assert got["blk.0.attn_q_norm.weight"] == ((256,), "F32")
    cfg = ModelConfig.from_gguf(GGUFFile(path).metadata)
    assert (cfg.arch, cfg.head_dim, cfg.sliding_window, cfg.post_norms, cfg.act) == \
        ("gemma3", 256, 16, True, "gelu_tanh")
    assert [cfg.is_swa_layer(i) for i in range(cfg.n_layer)] == [True] * 5 + [False, True]
    eng = Engine(path, device="cpu", max_context=64)
    logits = eng.prefill(list(range(5, 45)))                 # 40 tokens: past the window of 16
    assert logits.shape == (cfg.n_vocab,) and np.isfinite(logits).all() and 0.05 < logits.std() < 20
