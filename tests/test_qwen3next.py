"""qwen3next (issue 29, the CPU half): the hybrid Gated DeltaNet + gated attention + MoE family.

The reference is a tiny random Qwen3Next run by HF transformers (float32, on the same f16-rounded
weights), written to GGUF in llama.cpp's layout by tests/make_qwen3next_fixture.py; its outputs are
committed (tests/fixtures/qwen3next_{tiny.gguf,ref.npz}), so neither torch nor transformers runs here.
"""
import os
import sys

import numpy as np
import pytest

from lite.backends.cpu_recurrent import causal_conv_silu, delta_rule_chunked, delta_rule_recurrent
from lite.files.config import ModelConfig
from lite.engine.engine import Engine
from lite.errors import ConfigError
from lite.files.gguf_file import GGUFFile
from lite.engine.sampling import Sampler, SamplingParams


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_qwen3next_fixture as fixture  # noqa: E402  (its torch parts run only in main())

GGUF = fixture.GGUF_PATH
TOL = 1e-3                     # relative to the largest reference logit
GREEDY = Sampler(SamplingParams.greedy())


@pytest.fixture(scope="module")
def ref():
    r = np.load(fixture.REF_PATH)
    return {k: r[k] for k in r.files}


def engine(path=GGUF, **kw):
    kw.setdefault("prefill_chunk", 512)
    return Engine(path, device="cpu", max_context=256, kv="f32", **kw)


def rel_err(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def chunked_logits(e, ids, sizes):
    """All positions' logits, the prompt run in chunks of the given sizes, states carried."""
    outs, start = [], 0
    for n in sizes:
        outs += e._prefill_chain(ids[start:start + n], start, True)
        start += n
    assert start == len(ids)
    return np.concatenate(outs)


def split_prefill(ids, n):
    """The last logits of a fresh engine that prefills ids[:n], then the rest."""
    e = engine()
    e._prefill_chain(ids[:n], 0, False)
    return e._prefill_chain(ids[n:], n, False)[-1][-1]


def fixture_tensors():
    """The fixture's tensors as numpy arrays (f16 or f32), to write variants of the file."""
    g = GGUFFile(GGUF)
    dt = {"F16": np.float16, "F32": np.float32}
    return {n: t.raw.view(dt[t.type_name]).reshape(t.shape).copy() for n, t in g.tensors.items()}


# --- loading -----------------------------------------------------------------------------------
def test_config_reads_the_hybrid_keys():
    cfg = ModelConfig.from_gguf(GGUFFile(GGUF).metadata)
    assert cfg.arch == "qwen3next" and cfg.is_hybrid and cfg.is_moe
    assert cfg.recurrent == (True, False, True, False)          # full attention every 2nd layer
    assert (cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim) == (2, 4, 16, 16)
    assert cfg.ssm_conv_kernel == 4 and cfg.ssm_conv_channels == 2 * 2 * 16 + 4 * 16
    assert (cfg.head_dim, cfg.rope_dim, cfg.n_ff_shexp, cfg.n_ff_expert) == (16, 4, 48, 32)


def test_explicit_recurrent_layer_list_wins_over_the_interval():
    md = dict(GGUFFile(GGUF).metadata)
    md["qwen3next.attention.recurrent_layers"] = [1, 1, 1, 0]
    assert ModelConfig.from_gguf(md).recurrent == (True, True, True, False)
    del md["qwen3next.ssm.group_count"]
    with pytest.raises(ConfigError, match="qwen3next.ssm.group_count"):
        ModelConfig.from_gguf(md)


@pytest.mark.parametrize("name,shape", [("blk.0.ssm_conv1d.weight", None),
                                        ("blk.2.ssm_a", None),
                                        ("blk.0.ssm_ba.weight", (6, 64)),
                                        ("blk.2.ssm_out.weight", (64, 48))])
def test_missing_or_misshaped_ssm_tensor_is_one_line_naming_it(tmp_path, name, shape):
    t = fixture_tensors()
    if shape is None:
        del t[name]
    else:
        t[name] = np.zeros(shape, t[name].dtype)
    path = str(tmp_path / "bad.gguf")
    fixture.write_gguf(path, t)
    with pytest.raises(ConfigError) as e:
        engine(path)
    msg = str(e.value)
    assert name in msg and "\n" not in msg
    assert ("missing" in msg) if shape is None else ("has shape" in msg)


def test_old_fused_ssm_in_layout_gives_the_same_logits(tmp_path, ref):
    """Older files: one ssm_in per linear layer, rows per key head [q | k | v | z]."""
    t = fixture_tensors()
    hk, dk, rv = 2, 16, 2 * 16
    for il in (0, 2):
        b = f"blk.{il}."
        qkv, z = t.pop(b + "attn_qkv.weight"), t.pop(b + "attn_gate.weight")
        q, k, v = qkv[:hk * dk], qkv[hk * dk:2 * hk * dk], qkv[2 * hk * dk:]
        t[b + "ssm_in.weight"] = np.concatenate(
            [np.concatenate([q[h * dk:(h + 1) * dk], k[h * dk:(h + 1) * dk], v[h * rv:(h + 1) * rv],
                             z[h * rv:(h + 1) * rv]]) for h in range(hk)])
    path = str(tmp_path / "ssm_in.gguf")
    fixture.write_gguf(path, t)
    ids = [int(i) for i in ref["ids"]]
    assert rel_err(engine(path).prefill(ids, all_logits=True), ref["logits"]) < TOL


def test_info_shows_the_layer_kinds():
    from lite.files.info import describe
    out = describe(GGUF)
    assert "layer kinds:   2 Gated DeltaNet (recurrent), 2 full attention" in out


# --- the CPU reference against transformers ----------------------------------------------------
def test_whole_prompt_matches_transformers(ref):
    ids = [int(i) for i in ref["ids"]]
    assert rel_err(engine().prefill(ids, all_logits=True), ref["logits"]) < TOL


def test_uneven_chunks_match_transformers(ref):
    ids = [int(i) for i in ref["ids"]]
    got = chunked_logits(engine(), ids, (1, 37, 64, 48))
    assert rel_err(got, ref["logits"]) < TOL


def test_token_by_token_matches_transformers(ref):
    ids = [int(i) for i in ref["ids"]]
    e = engine()
    rows = [e.prefill(ids[:1], all_logits=True)[0]]
    rows += [e.decode_step(t) for t in ids[1:]]                 # the recurrent form of the delta rule
    assert rel_err(np.stack(rows), ref["logits"]) < TOL


def test_greedy_tokens_equal_transformers(ref):
    ids = [int(i) for i in ref["ids"]]
    got = list(engine().generate(ids, len(ref["greedy"]), GREEDY, stop_at_eog=False))
    assert got == [int(t) for t in ref["greedy"]]


# --- the second reference: llama.cpp (fixture from make_qwen3next_fixture.py --llamacpp) ----------
# llama.cpp rounds the activations to f16 in its f16 products and keeps an f16 KV cache: against
# transformers' float32 it is off by 2.2e-3 of the largest logit on this prompt, so 1e-2 here.
LLAMACPP_TOL = 1e-2


def test_whole_prompt_and_greedy_match_llamacpp(ref):
    ll = np.load(fixture.LLAMACPP_PATH)
    ids = [int(i) for i in ll["ids"]]
    assert ids == [int(i) for i in ref["ids"]]
    assert rel_err(engine().prefill(ids, all_logits=True), ll["logits"]) < LLAMACPP_TOL
    got = list(engine().generate(ids, len(ll["greedy"]), GREEDY, stop_at_eog=False))
    assert got == [int(t) for t in ll["greedy"]] == [int(t) for t in ref["greedy"]]


def test_llamacpp_runs_the_synth_layout(tmp_path):
    """llama.cpp loads what `lite synth --arch qwen3next` writes, and agrees with lite on it."""
    from lite.files.synth import synth
    ll = np.load(fixture.LLAMACPP_PATH)
    preset, quant, seed = fixture.SYNTH_CASE
    path = str(tmp_path / "synth.gguf")
    synth("qwen3next", preset, quant, path, seed=seed)
    got = engine(path).prefill([int(i) for i in ll["synth_ids"]])
    assert rel_err(got, ll["synth_last"]) < LLAMACPP_TOL
    assert int(np.argmax(got)) == int(np.argmax(ll["synth_last"]))


# --- the delta rule and the conv on their own --------------------------------------------------
def _delta_inputs(T, Hk=2, Hv=4, dk=16, dv=8, seed=0):
    rng = np.random.default_rng(seed)
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)   # noqa: E731
    q = unit(rng.standard_normal((T, Hk, dk))).astype(np.float32)
    k = unit(rng.standard_normal((T, Hk, dk))).astype(np.float32)
    v = rng.standard_normal((T, Hv, dv)).astype(np.float32)
    g = -rng.exponential(0.5, (T, Hv)).astype(np.float32)
    beta = rng.uniform(0, 1, (T, Hv)).astype(np.float32)
    S = rng.standard_normal((Hv, dk, dv)).astype(np.float32)
    return q, k, v, g, beta, S


@pytest.mark.parametrize("T", [1, 5, 64, 65, 150])
def test_chunked_delta_rule_equals_the_recurrence(T):
    q, k, v, g, beta, S = _delta_inputs(T)
    S1, S2 = S.copy(), S.copy()
    o1 = delta_rule_recurrent(q, k, v, g, beta, S1, 0.25)
    o2 = delta_rule_chunked(q, k, v, g, beta, S2, 0.25)
    assert np.abs(o1 - o2).max() < 1e-4 * max(1.0, np.abs(o1).max())
    assert np.abs(S1 - S2).max() < 1e-4 * max(1.0, np.abs(S1).max())


def test_chunked_delta_rule_survives_strong_decay():
    """exp(G_i - G_j) above the diagonal overflows; it must be masked before the exp."""
    q, k, v, g, beta, S = _delta_inputs(64)
    g[:] = -30.0
    with np.errstate(over="raise", invalid="raise"):
        o = delta_rule_chunked(q, k, v, g, beta, S.copy(), 0.25)
    assert np.isfinite(o).all()


def test_conv_state_carries_across_chunks():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((20, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    whole = causal_conv_silu(x, w, np.zeros((3, 6), np.float32))
    state = np.zeros((3, 6), np.float32)
    parts = [causal_conv_silu(x[a:b], w, state) for a, b in ((0, 1), (1, 3), (3, 11), (11, 20))]
    assert np.allclose(np.concatenate(parts), whole, atol=1e-6)
    np.testing.assert_array_equal(state, x[-3:])


# --- prefix reuse with a recurrent state -------------------------------------------------------
def test_prefix_reuse_where_the_states_stand_else_at_a_checkpoint(ref):
    ids = [int(i) for i in ref["ids"]]
    e = engine()
    e.prefill(ids[:100])
    assert e.last_reuse == 0
    # the new prompt extends everything cached: the states are at its 100th token, so reuse
    got = e.prefill(ids)
    assert e.last_reuse == 100
    assert rel_err(got, ref["logits"][-1]) < TOL
    # a prompt that shares 120 tokens: the states (at 150) cannot go back, so the checkpoint of
    # the first prompt's end (100) is restored and the rest prefilled
    other = ids[:120] + [(t + 1) % 280 for t in ids[120:]]
    got = e.prefill(other)
    assert e.last_reuse == 100
    np.testing.assert_array_equal(got, split_prefill(other, 100))
    # with the checkpoints gone, nothing is reused
    for st in e.stages:
        st.kv.recurrent.checkpoints.clear()
    e.prefill(ids)
    assert e.last_reuse == 0


@pytest.mark.parametrize("stages", [1, 2])
def test_a_long_prompt_keeps_a_checkpoint_every_n_tokens(ref, stages):
    ids = [int(i) for i in ref["ids"]]
    e = engine(prefill_chunk=16, layer_split=stages)
    for st in e.stages:
        st.kv.recurrent.every = 32
    e.prefill(ids)
    for st in e.stages:               # every stage keeps its own, at the same chunk ends
        assert sorted(st.kv.recurrent.checkpoints) == [32, 64, 96, 128, 150]
    other = ids[:140] + [(t + 3) % 280 for t in ids[140:]]
    got = e.prefill(other)
    assert e.last_reuse == 128
    fresh = engine(prefill_chunk=16, layer_split=stages).prefill(other)
    np.testing.assert_array_equal(got, fresh)     # the same chunk ends, so the same bytes
    assert sorted(e.stages[0].kv.recurrent.checkpoints) == [32, 64, 96, 128, 150]


def test_checkpoints_are_bounded_keeping_the_latest(ref):
    ids = [int(i) for i in ref["ids"]]
    e = engine(prefill_chunk=16)
    rs = e.stages[0].kv.recurrent
    rs.every, rs.keep = 16, 3
    e.prefill(ids)
    assert sorted(rs.checkpoints) == [128, 144, 150]
    assert all(c[1] is not rs.ssm[il] for il, c in rs.checkpoints[150].items())   # copies


def test_a_chat_second_turn_prefills_only_the_new_part(ref):
    """The second turn's prompt repeats the first turn and a re-rendered reply: the states stand
    past the shared part, so the first prompt's checkpoint serves it."""
    ids = [int(i) for i in ref["ids"]]
    first = ids[:60]
    e = engine()
    reply = list(e.generate(first, 8, GREEDY, stop_at_eog=False))
    assert e.stages[0].kv.recurrent.at() == 60 + 7        # the last token is not run
    second = first + reply[:5] + ids[60:90]
    got = e.prefill(second)
    assert e.last_reuse == 60
    prefilled = len(second) - e.last_reuse
    assert prefilled == 35
    np.testing.assert_array_equal(got, split_prefill(second, 60))


def test_a_chunk_off_the_states_position_leaves_them_unknown(ref):
    """A calibration's timing runs put chunks anywhere: the states are then unknown, and the
    engine does not reuse them (only a checkpoint)."""
    ids = [int(i) for i in ref["ids"]]
    e = engine()
    e.prefill(ids[:50])
    e._prefill_chain([1, 2, 3], 70, False)
    assert e.stages[0].kv.recurrent.at() == -1
    e.cached_ids = ids[:50]              # as if the cache still held the prompt
    got = e.prefill(ids)                 # the checkpoint of the prompt's end serves instead
    assert e.last_reuse == 50 and rel_err(got, ref["logits"][-1]) < TOL
    e._prefill_chain([1, 2, 3], 170, False)
    for st in e.stages:
        st.kv.recurrent.checkpoints.clear()
    got = e.prefill(ids)                 # unknown states and no checkpoint: nothing reused
    assert e.last_reuse == 0 and rel_err(got, ref["logits"][-1]) < TOL


def test_prefill_auto_calibrates_before_choosing_what_to_reuse(ref, tmp_path, monkeypatch):
    monkeypatch.setenv("LITE_CACHE", str(tmp_path / "cache"))     # no saved profile: calibrate
    ids = [int(i) for i in ref["ids"]]
    e = engine(prefill_chunk="auto")
    e.prefill(ids[:100])
    assert e.profile is not None
    got = e.prefill(ids)
    assert e.last_reuse == 100 and rel_err(got, ref["logits"][-1]) < TOL
