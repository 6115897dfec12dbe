"""The GPU backend against the CPU reference (runs on the GPU machine; skips elsewhere).

Synthetic models in real layouts (lite synth) cover every layer type and the quant types the
kernels serve; the real small models run too where their files are present. Decode-step attention
on the GPU: tests/test_cuda_decode_attention.py."""
import json
from pathlib import Path

import numpy as np
import pytest

from lite.backend_config import BackendConfig
from lite.backends import cuda_unavailable_reason
from lite.engine.engine import Engine
from lite.engine.sampling import Sampler, SamplingParams
from lite.files.synth import synth

WHY = cuda_unavailable_reason()
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"needs a GPU: {WHY}")
FIXTURES = Path(__file__).parent / "fixtures"
GREEDY = Sampler(SamplingParams.greedy())
# gemma3 (since session 4): head dim 256, GELU, sliding-window layers, tied output, post norms
SYNTH = [("llama", "Q4_K"), ("llama", "Q8_0"), ("qwen3", "Q6_K"), ("qwen3", "Q4_0"),
         ("llama", "IQ4_XS"), ("qwen3moe", "Q4_K"), ("gemma3", "Q4_K")]


# --- the backend against the CPU reference: synthetic and real models, decode paths on and off ---

@pytest.fixture(scope="module", params=SYNTH, ids=lambda p: f"{p[0]}-{p[1]}")
def synth_model(request, tmp_path_factory):
    arch, quant = request.param
    path = tmp_path_factory.mktemp("synth") / f"{arch}-{quant}.gguf"
    synth(arch, "tiny", quant, str(path), seed=3)
    return str(path)


def compare(path, ids, n_gen, kv="f16", rtol=1e-2, chunk=16, config=None):
    ctx = max(256, len(ids) + n_gen + 8)
    cpu = Engine(path, device="cpu", max_context=ctx, kv=kv, prefill_chunk=chunk)
    gpu = Engine(path, device="cuda", max_context=ctx, kv=kv, prefill_chunk=chunk, config=config)
    lc = cpu.prefill(ids, all_logits=True)
    lg = gpu.prefill(ids, all_logits=True)
    close = np.isclose(lg, lc, rtol=rtol, atol=rtol * np.abs(lc).max())
    if cpu.cfg.is_moe:
        # A router near a tie may pick another expert for a token when rounding differs (more so
        # with int8 KV): those positions differ, the rest must agree.
        assert close.mean() > 0.95, close.mean()
    else:
        np.testing.assert_allclose(lg, lc, rtol=rtol, atol=rtol * np.abs(lc).max())
    cpu.cached_ids, gpu.cached_ids = [], []
    want = list(cpu.generate(ids, n_gen, GREEDY, stop_at_eog=False))
    got = list(gpu.generate(ids, n_gen, GREEDY, stop_at_eog=False))
    return got, want


@pytest.mark.parametrize("kv", ["f16", "int8"])
def test_synth_gpu_matches_cpu(synth_model, kv):
    ids = list(range(5, 45))
    # int8 keys and values are rounded per token on each side from slightly different inputs,
    # and the GPU attends in fp16 on top: a looser bound than f16's 1e-2
    got, want = compare(synth_model, ids, 12, kv, rtol=1e-2 if kv == "f16" else 2e-2)
    # random weights give flat logits; require most greedy tokens to agree, and the first exactly
    assert got[0] == want[0]
    assert sum(a == b for a, b in zip(got, want)) >= len(want) // 2


@pytest.mark.parametrize("fold", ["0", "1"])
def test_virtual_stages_identical_on_gpu(synth_model, fold):
    """Stages change no result: logits bit for bit with the decode norms as separate launches
    (BackendConfig(fold_norm=False)). With them split across the products (the default) a stage boundary runs
    the plain norm where one stage runs the split one (sums of squares in another order: ~1e-6)
    for every one-token step (decode, and here the prefill's last chunk: 57 = 8 x 7 + 1), so
    those logits agree to that, step by step on the same inputs; chunks of 7 stay bit for bit."""
    cfg = BackendConfig(fold_norm=fold == "1")
    ids = list(range(3, 60))
    one = Engine(synth_model, device="cuda", max_context=128, prefill_chunk=7, config=cfg)
    many = Engine(synth_model, device="cuda", max_context=128, prefill_chunk=7, layer_split=3, config=cfg)
    pairs = [(one.prefill(ids, all_logits=True), many.prefill(ids, all_logits=True))]
    assert np.array_equal(pairs[0][0][:-1], pairs[0][1][:-1])
    tok = int(np.argmax(pairs[0][0][-1]))
    for _ in range(8):
        pairs.append((one.decode_step(tok), many.decode_step(tok)))
        tok = int(np.argmax(pairs[-1][0]))
    for a, b in pairs:
        if fold == "0":
            assert np.array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=q8_atol(synth_model) * np.abs(a).max())


def test_decode_graph_matches_plain_launches(synth_model):
    ids = list(range(7, 30))
    graphed = Engine(synth_model, device="cuda", max_context=128)
    plain = Engine(synth_model, device="cuda", max_context=128)
    for st in plain.stages:
        st.use_graphs = False
    a = list(graphed.generate(ids, 10, GREEDY, stop_at_eog=False))
    b = list(plain.generate(ids, 10, GREEDY, stop_at_eog=False))
    assert a == b


@pytest.mark.parametrize("key", ["smollm2", "gemma3"])
def test_real_model_gpu_matches_cpu(key):
    from lite.files.hub import KNOWN, cache_dir
    path = cache_dir() / "models" / KNOWN[key].filename
    doc = FIXTURES / "generate.json"
    cases = json.loads(doc.read_text()).get(key, {}).get("cases") if doc.exists() else None
    if not path.exists() or cases is None:
        pytest.skip(f"{path.name} or its fixtures are not on this machine")
    for case in cases:
        got, want = compare(str(path), case["prompt_ids"], len(case["generated"]), chunk=128)
        assert got == want


def _on_off_agree(path, switch, split=None):
    """Prefill and 8 greedy decode steps (graphs on; the first token after prefill through the
    plain path) with switch(on) then switch(off) called before each engine is made (a switch that
    returns a BackendConfig: the engine's config): the logits agree to ~1e-6 and the tokens
    exactly. Returns the two engines."""
    ids = list(range(5, 37))
    runs, engines = {}, {}
    for on in (True, False):
        config = switch(on)
        e = engines[on] = Engine(path, device="cuda", max_context=128, layer_split=split, config=config)
        logits = [e.prefill(ids)]
        for _ in range(8):
            logits.append(e.decode_step(int(np.argmax(logits[-1]))))
        runs[on] = logits
    for a, b in zip(runs[True], runs[False]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=q8_atol(path) * np.abs(b).max())
        assert int(np.argmax(a)) == int(np.argmax(b))
    return engines


def q8_atol(path):
    """Relative-to-max tolerance between two decode paths of one file: 1e-5 (the same fp32
    operations, reordered), or 2e-4 where Q4_K products run on kernels/matvec_q8.py's quantized x
    (the default): paths that hand the product x scaled differently (the folded norm's xg against
    the normed x) quantize it differently, each within max|x| / 64,516 of its run, and the
    differences go through every layer and step (measured on the H200, tiny llama: up to 5.4e-5 of
    the max logit after 8 steps; tokens equal)."""
    from lite.files.gguf_file import GGUFFile
    from lite.kernels import matvec_q8
    f = GGUFFile(path)
    types = {t.type_name for t in f.tensors.values()}
    f.close()
    return 2e-4 if any(matvec_q8.applies(t) for t in types) else 1e-5


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K"), ("qwen3", "Q6_K"), ("llama", "Q8_0"),
                                        ("gemma3", "Q4_K"), ("llama", "IQ3_XXS")])
def test_matvec_epilogues_equal_the_separate_launches(tmp_path, monkeypatch, arch, quant):
    """Decode with the residual add and the FFN activation folded into the products
    (kernels/matvec_epilogue.py, the default) against the separate launches (BackendConfig.epilogues
    off): the same fp32 operations, so the logits agree to the last bits and the tokens exactly."""
    path = str(tmp_path / "m.gguf")
    synth(arch, "tiny", quant, path, seed=6)
    _on_off_agree(path, lambda on: BackendConfig(epilogues=on))


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_K"), ("qwen3", "Q6_K"), ("llama", "Q8_0"),
                                        ("qwen3moe", "Q4_K"), ("gemma3", "Q4_K")])
def test_programmatic_dependent_launch_changes_nothing(tmp_path, monkeypatch, arch, quant):
    """BackendConfig.pdl (kernels/pdl.py, default on GPUs of compute capability 9.0+): the decode matvecs,
    attention and MoE kernels launched with programmatic dependencies, inside captured graphs too:
    the same arithmetic, so the same logits (to the tolerance of _on_off_agree) and tokens."""
    path = str(tmp_path / "m.gguf")
    synth(arch, "tiny", quant, path, seed=12)
    _on_off_agree(path, lambda on: BackendConfig(pdl=on))


@pytest.mark.parametrize("quant", ["Q4_K", "Q8_0"])
def test_moe_gated_form_matches_the_separate_launches(tmp_path, monkeypatch, quant):
    """moe_decode_product's gated form (decode's default: gate, up and the activation in one launch) against
    gate and up, then moe_act_f32 (BackendConfig.moe_gated off)."""
    from lite.backend_config import BackendConfig
    path = str(tmp_path / "m.gguf")
    synth("qwen3moe", "tiny", quant, path, seed=9)
    _on_off_agree(path, lambda on: BackendConfig(moe_gated=on))


@pytest.mark.parametrize("form", ["float_x", "int8_dot"])
@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen3moe"])
def test_both_q4k_dot_forms_match_cpu(tmp_path, monkeypatch, arch, form):
    """Q4_K decode products (matvec_rows, the epilogue kernels matvec_fused_end, the MoE experts' moe_decode_product) with the dot in 2
    instructions a weight over float x (float_x: matvec_rows over kernels/matvec_structs.py TQ4_KH) or on dp4a over
    quantized x (int8_dot: kernels/matvec_q8.py): each against the CPU backend as every GPU path is. (Not against each other
    at 1e-5: the rearranged sums, ~6e-6 a 16-weight run, grow past that through gemma3's and
    qwen3moe's layers.)"""
    types = ("Q4_K",) if form == "int8_dot" else ()    # int8_dot: matvec_q8, the default
    path = str(tmp_path / "m.gguf")
    synth(arch, "tiny", "Q4_K", path, seed=12)
    got, want = compare(path, list(range(5, 45)), 12, config=BackendConfig(int8_dot_types=types))
    assert got[0] == want[0]
    assert sum(a == b for a, b in zip(got, want)) >= len(want) // 2


@pytest.mark.parametrize("arch,quant,split", [("llama", "Q4_K", None), ("llama", "Q8_0", 2),
                                              ("qwen3", "Q6_K", None), ("qwen3moe", "Q4_K", None),
                                              ("llama", "IQ3_XXS", None)])
def test_folded_norms_match_the_separate_launches(tmp_path, monkeypatch, arch, quant, split):
    """BackendConfig.fold_norm (lite/backends/cuda_norm.py: the decode RMSNorms split across the residual
    add's product and the products that read the norm, kernels/matvec_epilogue.py's norm out and
    scale in) against the separate rms_norm launches: the sums of squares in another order and
    the scale after the product, so logits agree to ~1e-6, greedy tokens exactly. Two stages (the
    first stage's last residual add is materialized for the hand-off)."""
    path = str(tmp_path / "m.gguf")
    synth(arch, "tiny", quant, path, seed=8)
    engines = _on_off_agree(path, lambda on: BackendConfig(fold_norm=on), split)
    assert all(b.ops.fold_norm == on for on, e in engines.items() for b in e.stages)


def test_regrouped_iq3xxs_weights_match_cpu_and_the_file_layout(tmp_path):
    """BackendConfig(iq3_layout="groups4") (lite/backends/cuda.py _regroup_iq3, kernels/gpu_layout.py,
    kernels/iq3_groups.py): the IQ3_XXS matrices (q/k/v stacked, gate/up, o, down: every row whole
    groups at this shape) stored regrouped, read by the decode products (Iq3XxsGroup4Int8X) and the
    prefill's dequantize: against the CPU, and against the file's layout (iq3_layout="file"; the
    same integer sums: the logits agree to _on_off_agree's tolerance)."""
    g4 = BackendConfig(iq3_layout="groups4")
    path = str(tmp_path / "m.gguf")
    synth("llama", "small", "IQ3_XXS", path, seed=4)
    kinds = {w.qtype for w in Engine(path, device="cuda", max_context=64, config=g4).stages[0].ops.w.values()}
    assert "IQ3_XXS_G4" in kinds and "IQ3_XXS" not in kinds, kinds
    got, want = compare(path, list(range(5, 45)), 12, config=g4)
    assert got[0] == want[0]
    assert sum(a == b for a, b in zip(got, want)) >= len(want) // 2
    _on_off_agree(path, lambda on: BackendConfig(iq3_layout="groups4" if on else "file"))
    # the epilogue kernels (residual add, gated activation over interleaved rows) on the regrouped
    # weights against the separate launches
    _on_off_agree(path, lambda on: BackendConfig(iq3_layout="groups4", epilogues=on))


def test_iq3_b16_weights_match_cpu_and_g4(tmp_path):
    """BackendConfig(iq3_layout="bands16") (the default; lite/backends/cuda.py _regroup_iq3): the IQ3_XXS matrices of whole
    bands as IQ3_XXS_B16, their decode products through kernels/matvec_mma.py (bands16_product, and bands16_product_fused_end for the residual
    add, the gated activation, the norm's scale in and norm out), prefill through kernels/iq3_b16.py:
    against the CPU, and against the G4 layout (the same integer sums up to the products' own float orders:
    _on_off_agree's tolerance), with the epilogues and the folded norms on and off."""
    path = str(tmp_path / "m.gguf")
    synth("llama", "small", "IQ3_XXS", path, seed=4)
    kinds = {w.qtype for w in Engine(path, device="cuda", max_context=64).stages[0].ops.w.values()}
    assert "IQ3_XXS_B16" in kinds, kinds
    got, want = compare(path, list(range(5, 45)), 12)
    assert got[0] == want[0]
    assert sum(a == b for a, b in zip(got, want)) >= len(want) // 2
    _on_off_agree(path, lambda on: BackendConfig(iq3_layout="bands16" if on else "groups4"))
    _on_off_agree(path, lambda on: BackendConfig(epilogues=on))
    _on_off_agree(path, lambda on: BackendConfig(fold_norm=on))
