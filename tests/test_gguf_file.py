"""GGUF reading: a valid file loads; every truncated or bit-flipped variant loads or raises GGUFError."""

import numpy as np
import pytest
from gguf import GGUFWriter, GGMLQuantizationType
from gguf.quants import quantize

from lite.errors import GGUFError
from lite.files.gguf_file import GGUFFile


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_string("test.name", "tiny")
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.strs", ["a", "bc", "é"])
    w.add_float32("test.f", 0.5)
    rng = np.random.default_rng(0)
    w.add_tensor("a.weight", rng.standard_normal((4, 8)).astype(np.float32))
    q8 = quantize(rng.standard_normal((2, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    w.add_tensor("b.weight", q8, raw_shape=q8.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("c.weight", rng.standard_normal(16).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_valid_file_loads(small_gguf):
    g = GGUFFile(small_gguf)
    assert g.architecture == "llama"
    assert g.metadata["test.strs"] == ["a", "bc", "é"]
    assert list(g.metadata["test.ints"]) == [1, 2, 3]
    assert g.tensors["a.weight"].shape == (4, 8)
    assert g.tensors["b.weight"].shape == (2, 64)
    assert g.tensors["b.weight"].type_name == "Q8_0"
    a = g.tensors["a.weight"].raw.view(np.float32).reshape(4, 8)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(a, rng.standard_normal((4, 8)).astype(np.float32))


def _load_or_gguf_error(path):
    try:
        GGUFFile(path)
    except GGUFError:
        pass


def test_every_truncation(small_gguf, tmp_path):
    data = small_gguf.read_bytes()
    bad = tmp_path / "t.gguf"
    for n in range(len(data)):
        bad.write_bytes(data[:n])
        with pytest.raises(GGUFError):
            GGUFFile(bad)


def test_random_bit_flips(small_gguf, tmp_path):
    data = bytearray(small_gguf.read_bytes())
    rng = np.random.default_rng(1)
    bad = tmp_path / "f.gguf"
    # Flips in the header and tensor table are the interesting ones; the tensor data is opaque.
    header_end = GGUFFile(small_gguf).tensors["a.weight"].offset
    for i in range(3000):
        d = bytearray(data)
        for _ in range(1 + i % 3):
            pos = int(rng.integers(0, header_end))
            d[pos] ^= 1 << int(rng.integers(0, 8))
        bad.write_bytes(bytes(d))
        _load_or_gguf_error(bad)


def test_random_bytes_in_header(small_gguf, tmp_path):
    data = bytearray(small_gguf.read_bytes())
    rng = np.random.default_rng(2)
    bad = tmp_path / "r.gguf"
    for _ in range(1000):
        d = bytearray(data)
        pos = int(rng.integers(4, 64))
        d[pos:pos + 8] = rng.integers(0, 256, 8, dtype=np.uint8).tobytes()
        bad.write_bytes(bytes(d))
        _load_or_gguf_error(bad)


@pytest.mark.parametrize("content,match", [
    (b"", "empty"),
    (b"GGML\x03\x00\x00\x00" + b"\x00" * 16, "bad magic"),
    (b"GGUF\x01\x00\x00\x00" + b"\x00" * 16, "unsupported GGUF version 1"),
    (b"GGUF\x03\x00\x00\x00" + (2**40).to_bytes(8, "little") + b"\x00" * 8, "truncated"),
])
def test_specific_faults(tmp_path, content, match):
    p = tmp_path / "x.gguf"
    p.write_bytes(content)
    with pytest.raises(GGUFError, match=match):
        GGUFFile(p)


def test_missing_and_directory(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="directory"):
        GGUFFile(tmp_path)


def test_error_names_the_file(small_gguf, tmp_path):
    p = tmp_path / "named.gguf"
    p.write_bytes(small_gguf.read_bytes()[:100])
    with pytest.raises(GGUFError) as e:
        GGUFFile(p)
    assert str(p) in str(e.value)
