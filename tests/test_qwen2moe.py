"""qwen2moe: ModelConfig, the synth layout, and the shared expert's sigmoid gate on the CPU.

Expected values come from llama.cpp's src/models/qwen2moe.cpp (create_tensor shapes in ggml order
{ne0, ne1} reversed here to numpy order; build_moe_ffn called with norm_w false; the n_ff fallbacks),
its converter's Qwen2MoeModel (metadata keys) and Qwen1.5-MoE-A2.7B's config.json; not from lite.
The forward itself is checked against llama.cpp in tests/test_synth_reference.py.
"""
import numpy as np
import pytest
from click.testing import CliRunner

from cli.synth import synth as synth_cmd
from lite.backends.cpu import CPUBackend
from lite.config import ModelConfig
from lite.errors import ConfigError
from lite.gguf_file import GGUFFile
from lite.synth import SynthError, plan, synth


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
def tiny(tmp_path_factory):
    return synth("qwen2moe", "tiny", "Q4_K", tmp_path_factory.mktemp("q2m") / "t.gguf", seed=0)["path"]


def test_tiny_layout_matches_llama_cpp(tiny):
    # tiny: n_embd 256, 4 heads of 64 (llama.cpp wants n_head * head_dim == n_embd), 2 KV heads,
    # 16 experts of ffn 512, shared expert ffn 768
    f = GGUFFile(tiny)
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


def test_biases_and_gate_are_random_not_constant(tiny):
    f = GGUFFile(tiny)
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
    """tests/fixtures/synth_qwen2moe.json (llama.cpp's outputs) was made from the file synth writes now."""
    import hashlib
    import json
    import os
    from lite.tokenizer import Tokenizer
    fx = json.load(open(os.path.join(os.path.dirname(__file__), "fixtures", "synth_qwen2moe.json")))
    f = synth("qwen2moe", fx["preset"], fx["quant"], tmp_path / "f.gguf", seed=fx["seed"])["path"]
    assert hashlib.sha256(open(f, "rb").read()).hexdigest() == fx["file_sha256"], \
        "synth's output changed: rerun tests/make_synth_fixtures.py --arch qwen2moe"
    assert Tokenizer.from_metadata(GGUFFile(f).metadata).encode(fx["text"]) == fx["text_ids"]
    assert fx["min_margin"] > 0.06      # greedy choices well clear of llama.cpp/lite rounding (~0.01)
