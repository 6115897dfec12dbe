"""Every quant type the gguf package dequantizes runs on the CPU path: a tiny synthetic llama in
each type gives finite logits, and its weights dequantize exactly as gguf-py does."""
import numpy as np
import pytest
from gguf import quants as gguf_quants

from lite.backends.cpu import dequantize_tensor
from lite.engine import Engine
from lite.gguf_file import GGUFFile
from lite.synth import QUANT_TYPES, synth


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_tiny_model_in_every_type(qtype, tmp_path):
    path = tmp_path / f"tiny-{qtype}.gguf"
    synth("llama", "tiny", qtype, str(path), seed=1)
    g = GGUFFile(path)
    t = g.tensors["blk.0.ffn_down.weight"]
    assert t.type_name == qtype
    want = gguf_quants.dequantize(t.raw.reshape(t.shape[0], -1), t.qtype)
    assert np.array_equal(dequantize_tensor(t), want.astype(np.float32))
    logits = Engine(str(path), device="cpu", max_context=32).prefill([5, 17, 99, 3])
    assert logits.shape == (512,) and np.all(np.isfinite(logits))
