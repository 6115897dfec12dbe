"""qwen3next through the stage chain and the server's step, and its synthetic files: stage counts give
identical bytes, each stage owns its layers' states, the 80B preset's layout and metadata, a tiny
synthetic file that runs, a backend without the hybrid ops, and the server batching hybrid sequences
each with its own states."""
from dataclasses import replace

import numpy as np
import pytest

from lite.files.config import ModelConfig
from lite.engine.engine import Engine
from lite.errors import ConfigError
from lite.files.gguf_file import GGUFFile
from lite.engine.sampling import SamplingParams
from conftest import assert_stage_counts_agree
from test_qwen3next import GGUF, GREEDY, engine


# --- the stage chain ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synth_tiny(tmp_path_factory):
    from lite.files.synth import synth
    path = tmp_path_factory.mktemp("q3n") / "qwen3next.gguf"
    synth("qwen3next", "tiny", "Q4_K", str(path), seed=3)
    return str(path)


@pytest.mark.parametrize("which", ["fixture", "synth"])
def test_stage_counts_give_identical_bytes(which, synth_tiny):
    path = GGUF if which == "fixture" else synth_tiny
    assert_stage_counts_agree(
        lambda stages: Engine(path, device="cpu", max_context=128, prefill_chunk=16, layer_split=stages),
        list(range(7, 60)), 6)


def test_each_stage_owns_its_layers_states():
    e = engine(layer_split=[1, 3])
    first, second = (st.kv.recurrent for st in e.stages)
    assert sorted(first.ssm) == [0] and sorted(second.ssm) == [2]
    assert sorted(e.stages[0].kv.k) == [] and sorted(e.stages[1].kv.k) == [1, 3]
    e.prefill(list(range(30)))
    assert first.at() == second.at() == 30


# --- synth -------------------------------------------------------------------------------------
def test_synth_80b_layout_and_metadata(tmp_path):
    """The 80B-A3B preset's shapes and keys (no weights written): its config, and every layer's
    tensors as models/qwen3next.py checks them."""
    from types import SimpleNamespace

    from gguf import GGUFWriter

    from lite.files import synth as synth_mod
    from lite.models import qwen3next
    p = synth_mod.get_preset("qwen3next", "80b-a3b")
    path = str(tmp_path / "meta.gguf")
    w = GGUFWriter(path, "qwen3next")
    synth_mod._metadata(w, "qwen3next", "80b-a3b", p, "IQ3_XXS")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    cfg = ModelConfig.from_gguf(GGUFFile(path).metadata)
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim) == (48, 2048, 16, 2, 256)
    assert sum(cfg.recurrent) == 36 and [i for i in range(48) if not cfg.recurrent[i]][:3] == [3, 7, 11]
    assert (cfg.ssm_k_heads, cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim) == (16, 32, 128, 128)
    assert (cfg.n_expert, cfg.n_expert_used, cfg.n_ff_expert, cfg.n_ff_shexp) == (512, 10, 512, 512)
    assert cfg.rope_dim == 64 and cfg.rope_base == 1e7 and cfg.context_length == 262144
    specs = synth_mod.plan("qwen3next", "80b-a3b", "IQ3_XXS")
    fake = SimpleNamespace(path=path, tensors={s.name: SimpleNamespace(shape=s.shape) for s in specs})
    qwen3next.check_tensors(fake, cfg, range(48))
    shapes = {s.name: s.shape for s in specs}
    assert shapes["blk.0.attn_qkv.weight"] == (8192, 2048)       # ggml {2048, 8192}
    assert shapes["blk.0.ssm_conv1d.weight"] == (8192, 4)
    assert shapes["blk.3.attn_q.weight"] == (8192, 2048)
    assert shapes["blk.0.ffn_gate_exps.weight"] == (512, 512, 2048)
    assert shapes["output.weight"] == (151936, 2048)


def test_synth_tiny_runs_and_checks(synth_tiny):
    e = Engine(synth_tiny, device="cpu", max_context=64, prefill_chunk=64)
    assert e.cfg.recurrent == (True, False, True, False)
    assert np.isfinite(e.prefill(list(range(3, 40)), all_logits=True)).all()
    bad = replace(e.cfg, ssm_v_heads=8)
    from lite.models import qwen3next
    with pytest.raises(ConfigError, match="blk.0.attn_qkv.weight"):
        qwen3next.check_tensors(e.gguf, bad, range(4))


def test_synth_writes_the_first_layers_of_a_preset(tmp_path):
    """--layers: a short file in a big layout (the GPU tests' 80B-A3B file has 4 of its 48)."""
    from lite.files.synth import SynthError, synth
    synth("qwen3next", "tiny", "Q4_K", str(tmp_path / "two.gguf"), seed=3, n_layer=2)
    e = Engine(str(tmp_path / "two.gguf"), device="cpu", max_context=32)
    assert e.cfg.n_layer == 2 and e.cfg.recurrent == (True, False)
    assert np.isfinite(e.prefill(list(range(3, 20)))).all()
    with pytest.raises(SynthError, match="layers must be 1..4"):
        synth("qwen3next", "tiny", "Q4_K", str(tmp_path / "x.gguf"), n_layer=5)


def test_a_backend_without_the_hybrid_ops_is_one_line():
    from lite.backends.cpu import CPUBackend
    from lite.backends.ops import Ops
    from lite.models import qwen3next

    qwen3next.check_backend(CPUBackend)

    class NoDelta(Ops):
        name = "gpu-like"
    with pytest.raises(ConfigError, match=r"no sigmoid_mul.*delta_rule, recurrent_state\): use --device cpu"):
        qwen3next.check_backend(NoDelta)


# --- the server's batched step -----------------------------------------------------------------
@pytest.mark.parametrize("stages", [1, 2])
def test_the_server_batches_hybrid_sequences_each_with_its_own_states(stages):
    """Three requests of different lengths in one scheduler (chunked prefill mixed with decode):
    each gets the text it gets alone from Engine.generate; the prefix cache is not used, since a
    recurrent state cannot be rebuilt from KV blocks."""
    import threading
    from lite.engine.scheduler import Scheduler
    from lite.engine.sequence import GenParams
    e = Engine(GGUF, device="cpu", max_context=128, contiguous_kv=False, layer_split=stages)
    sched = Scheduler(e, n_slots=3, chunk=16).start()
    prompts = [list(range(5, 45)), list(range(7, 20)), list(range(30, 90)), list(range(5, 45))]
    texts, finals, done = [[] for _ in prompts], [None] * len(prompts), [threading.Event() for _ in prompts]

    def emitter(i):
        def emit(ev):
            if "text" in ev:
                texts[i].append(ev["text"])
            if "finish" in ev or "error" in ev:
                finals[i] = ev
                done[i].set()
        return emit
    try:
        for i, p in enumerate(prompts):
            sched.submit(p, GenParams(max_tokens=6, sampling=SamplingParams.greedy()), emitter(i))
        assert all(d.wait(120) for d in done)
    finally:
        sched.stop()
    alone = engine()
    for i, p in enumerate(prompts):
        assert "error" not in finals[i], finals[i]
        alone.cached_ids = []
        want = alone.tokenizer.decode(list(alone.generate(p, 6, GREEDY)))
        assert "".join(texts[i]) == want, i
        assert finals[i]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
