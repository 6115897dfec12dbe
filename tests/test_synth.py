"""lite synth: random-weight GGUF files in llama.cpp's layouts; and qwen2moe: ModelConfig, the synth
layout, and the shared expert's sigmoid gate on the CPU.

The expected layouts below are written from llama.cpp's tensor naming (llama-arch.cpp, the
create_tensor calls of src/models/{llama,qwen3,qwen3moe}.cpp, shapes there in ggml order {ne0, ne1}
reversed here to numpy order) and from the presets' numbers in the brief, not from lite/files/synth.py.
qwen2moe's expected values come from llama.cpp's src/models/qwen2moe.cpp (create_tensor shapes
reversed the same way; build_moe_ffn called with norm_w false; the n_ff fallbacks), its converter's
Qwen2MoeModel (metadata keys) and Qwen1.5-MoE-A2.7B's config.json; not from lite. The forwards
themselves are checked against llama.cpp in tests/test_reference_llamacpp.py (its fixtures,
tests/fixtures/synth.json, are checked here to come from the files synth writes now).
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
from lite.backends.cpu import CPUBackend
from lite.files.config import ModelConfig
from lite.errors import ConfigError
from lite.files.gguf_file import GGUFFile
from lite.files.synth import QUANT_TYPES, SynthError, TensorSpec, plan, synth, tensor_bytes

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
    from lite.engine.engine import Engine
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
    path = os.path.join(HERE, "fixtures", "synth.json")
    fixtures = json.load(open(path)) if os.path.exists(path) else {}
    if arch not in fixtures:
        pytest.skip(f"{path} has no {arch} yet (tests/make_llamacpp_fixtures.py synth)")
    fx = fixtures[arch]
    f = synth(arch, fx["preset"], fx["quant"], tmp_path / "f.gguf", seed=fx["seed"])["path"]
    assert hashlib.sha256(open(f, "rb").read()).hexdigest() == fx["file_sha256"], \
        "synth's output changed: rerun tests/make_llamacpp_fixtures.py synth"
    from lite.files.tokenizer import Tokenizer
    tok = Tokenizer.from_metadata(GGUFFile(f).metadata)
    assert tok.encode(fx["text"]) == fx["text_ids"]
    assert len(fx["token_ids"]) == 12 and len(fx["top_ids"]) == 10 and len(fx["greedy"]) == 8


def test_tiny_gemma3_has_the_real_files_layout(tmp_path):
    """A layer's tensors are those of the Gemma 3 270M file (its names, written down from that file:
    q/k norms of head_dim, post norms), the output is tied (no output.weight), the config reads it
    as gemma3 with head dim 256, a window of 16 and layer 5 global; the CPU forward past the window
    gives finite, spread logits."""
    from lite.engine.engine import Engine
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


# --- qwen2moe: its config, its synth layout, its shared expert's gate ---

def a27b_metadata(drop=()):
    """Metadata as the converter writes it for Qwen1.5-MoE-A2.7B (tokenizer aside)."""
    md = {"general.architecture": "qwen2moe", "qwen2moe.block_count": 24,
          "qwen2moe.context_length": 8192, "qwen2moe.embedding_length": 2048,
          "qwen2moe.feed_forward_length": 5632, "qwen2moe.attention.head_count": 16,
          "qwen2moe.attention.head_count_kv": 16, "qwen2moe.rope.freq_base": 1000000.0,
          "qwen2moe.attention.layer_norm_rms_epsilon": 1e-6, "qwen2moe.expert_count": 60,
          "qwen2moe.expert_used_count": 4, "qwen2moe.expert_feed_forward_length": 1408,
          "qwen2moe.expert_shared_feed_forward_length": 5632,
          "tokenizer.ggml.tokens": ["x"] * 151936}
    for k in drop:
        del md[f"qwen2moe.{k}"]
    return md


def test_config_reads_qwen2moe():
    cfg = ModelConfig.from_gguf(a27b_metadata())
    assert cfg.arch == "qwen2moe" and cfg.is_moe
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == (24, 2048, 16, 16, 128)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_expert, cfg.n_ff_shexp) == (60, 4, 1408, 5632)
    assert (cfg.attn_bias, cfg.rope_neox, cfg.qk_norm, cfg.act) == (True, True, False, "silu")
    assert cfg.expert_weights_norm is False            # llm_build_qwen2moe: norm_w false
    assert cfg.rope_base == 1e6 and cfg.n_vocab == 151936
    assert cfg.attn_scale == pytest.approx(128 ** -0.5)


def test_config_qwen3moe_still_renormalizes_and_has_no_shared_expert():
    md = {k.replace("qwen2moe", "qwen3moe"): v for k, v in a27b_metadata().items()}
    md["general.architecture"] = "qwen3moe"
    cfg = ModelConfig.from_gguf(md)
    assert cfg.expert_weights_norm is True and cfg.n_ff_shexp == 0 and not cfg.attn_bias


def test_config_qwen2moe_fallbacks_and_errors():
    # llama.cpp: n_ff_exp = n_ff / n_expert_used, n_ff_shexp = n_ff when the keys are absent
    cfg = ModelConfig.from_gguf(a27b_metadata(drop=("expert_feed_forward_length",
                                                    "expert_shared_feed_forward_length")))
    assert (cfg.n_ff_expert, cfg.n_ff_shexp) == (5632 // 4, 5632)
    with pytest.raises(ConfigError, match="'qwen2moe.expert_count' is missing"):
        ModelConfig.from_gguf(a27b_metadata(drop=("expert_count",)))
    with pytest.raises(ConfigError, match="'qwen2moe.expert_used_count' is missing"):
        ModelConfig.from_gguf(a27b_metadata(drop=("expert_used_count",)))


@pytest.fixture(scope="module")
def tiny_qwen2moe(tmp_path_factory):
    return synth("qwen2moe", "tiny", "Q4_K", tmp_path_factory.mktemp("q2m") / "t.gguf", seed=0)["path"]


def test_tiny_layout_matches_llama_cpp(tiny_qwen2moe):
    # tiny: n_embd 256, 4 heads of 64 (llama.cpp wants n_head * head_dim == n_embd), 2 KV heads,
    # 16 experts of ffn 512, shared expert ffn 768
    f = GGUFFile(tiny_qwen2moe)
    got = {n: (t.shape, t.type_name) for n, t in f.tensors.items()}
    assert len(got) == 3 + 4 * 17
    for i in range(4):
        b = f"blk.{i}."
        want = {"attn_norm.weight": ((256,), "F32"), "ffn_norm.weight": ((256,), "F32"),
                "attn_q.weight": ((256, 256), "Q4_K"), "attn_q.bias": ((256,), "F32"),
                "attn_k.weight": ((128, 256), "Q4_K"), "attn_k.bias": ((128,), "F32"),
                "attn_v.weight": ((128, 256), "Q4_K"), "attn_v.bias": ((128,), "F32"),
                "attn_output.weight": ((256, 256), "Q4_K"),
                "ffn_gate_inp.weight": ((16, 256), "F32"),
                "ffn_gate_exps.weight": ((16, 512, 256), "Q4_K"),
                "ffn_up_exps.weight": ((16, 512, 256), "Q4_K"),
                "ffn_down_exps.weight": ((16, 256, 512), "Q4_K"),
                "ffn_gate_inp_shexp.weight": ((256,), "F32"),
                "ffn_gate_shexp.weight": ((768, 256), "Q4_K"),
                "ffn_up_shexp.weight": ((768, 256), "Q4_K"),
                "ffn_down_shexp.weight": ((256, 768), "Q4_K")}
        for n, v in want.items():
            assert got[b + n] == v, n
        assert b + "attn_q_norm.weight" not in got and b + "ffn_gate.weight" not in got
    md = f.metadata
    assert md["general.architecture"] == "qwen2moe" and md["tokenizer.ggml.pre"] == "qwen2"
    assert (md["qwen2moe.expert_count"], md["qwen2moe.expert_used_count"],
            md["qwen2moe.expert_feed_forward_length"],
            md["qwen2moe.expert_shared_feed_forward_length"]) == (16, 2, 512, 768)
    assert "qwen2moe.attention.key_length" not in md      # Qwen1.5-MoE's config has no head_dim
    cfg = ModelConfig.from_gguf(md)
    assert (cfg.n_ff_shexp, cfg.n_ff_expert, cfg.expert_weights_norm) == (768, 512, False)


def test_biases_and_gate_are_random_not_constant(tiny_qwen2moe):
    f = GGUFFile(tiny_qwen2moe)
    for n in ("blk.0.attn_q.bias", "blk.2.attn_v.bias", "blk.1.ffn_gate_inp_shexp.weight"):
        v = f.tensors[n].raw.view(np.float32)
        assert np.isfinite(v).all() and v.std() > 0.03


def test_a27b_plan_and_its_k_quant_limit():
    specs = {s.name: s for s in plan("qwen2moe", "a2.7b", "Q8_0")}
    assert len(specs) == 3 + 24 * 17
    assert specs["blk.23.ffn_down_exps.weight"].shape == (60, 2048, 1408)
    assert specs["blk.0.ffn_gate_shexp.weight"].shape == (5632, 2048)
    assert specs["blk.0.attn_q.weight"].shape == (2048, 2048)
    with pytest.raises(SynthError, match="1408 values are not whole Q4_K blocks"):
        plan("qwen2moe", "a2.7b", "Q4_K")


def test_cli_synth_qwen2moe(tmp_path):
    out = tmp_path / "q.gguf"
    r = CliRunner().invoke(synth_cmd, ["--arch", "qwen2moe", "--preset", "tiny", str(out)])
    assert r.exit_code == 0, r.output
    assert GGUFFile(out).tensors["blk.3.ffn_up_shexp.weight"].type_name == "Q4_K"


def test_cpu_sigmoid_gate_scales_each_row_by_its_own_gate():
    ops = CPUBackend.__new__(CPUBackend)        # only the weight table is needed here
    ops.w = {"g": np.array([1.0, 0.0, 0.0], np.float32)}
    h = np.array([[0.0, 5.0, 5.0], [np.log(3.0), 1.0, 2.0], [-np.log(3.0), 0.0, 0.0]], np.float32)
    x = np.array([[2.0, 4.0], [4.0, 8.0], [4.0, -8.0]], np.float32)
    # sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4
    np.testing.assert_allclose(ops.sigmoid_gate(x, h, "g"), [[1, 2], [3, 6], [1, -2]], rtol=1e-6)
    ops.w = {"g": ops.w["g"][None, :]}          # a (1, n_embd) vector reads the same
    np.testing.assert_allclose(ops.sigmoid_gate(x, h, "g"), [[1, 2], [3, 6], [1, -2]], rtol=1e-6)


def test_fixture_is_from_this_synth_and_lite_tokenizes_alike(tmp_path):
    """tests/fixtures/synth.json's qwen2moe (llama.cpp's outputs) was made from the file synth writes now."""
    from lite.files.tokenizer import Tokenizer
    fx = json.load(open(os.path.join(HERE, "fixtures", "synth.json")))["qwen2moe"]
    f = synth("qwen2moe", fx["preset"], fx["quant"], tmp_path / "f.gguf", seed=fx["seed"])["path"]
    assert hashlib.sha256(open(f, "rb").read()).hexdigest() == fx["file_sha256"], \
        "synth's output changed: rerun tests/make_llamacpp_fixtures.py synth --arch qwen2moe"
    assert Tokenizer.from_metadata(GGUFFile(f).metadata).encode(fx["text"]) == fx["text_ids"]
    assert fx["min_margin"] > 0.06      # greedy choices well clear of llama.cpp/lite rounding (~0.01)
