"""What the emulated tests of the server's paged step share (test_batched_step_emulated.py,
test_decode_graphs_emulated.py, test_paged_flash_emulated.py): the paged-attention kernels against
tests/cuda_c_emulator.py, block tables out of order, and a synthetic llama on paged KV.

Test modules import the fixtures by name (`from paged_emulated import pa, tiny`) so pytest sees them."""
import pytest

from cuda_c_emulator import available, emulated_kernels

needs_gxx = pytest.mark.skipif(not available(), reason="needs g++ (C++20) to emulate CUDA C")


@pytest.fixture(scope="module")
def pa():
    """kernels/paged_attention.py imported against a NumPy-backed `cupy` whose RawModule emulates
    (memory from empty() starts as NaN bytes, so a row no kernel wrote shows)."""
    with emulated_kernels("paged_attention") as mods:
        yield mods["paged_attention"]


def _tables(rng, lens, B, n_blocks):
    """Block tables drawn from a shuffled pool: every sequence's blocks out of order."""
    free = list(rng.permutation(n_blocks))
    return [[int(free.pop()) for _ in range(-(-L // B))] for L in lens]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from lite.engine.engine import Engine
    from lite.files.synth import synth
    path = tmp_path_factory.mktemp("synth") / "llama-q8.gguf"
    synth("llama", "tiny", "Q8_0", str(path), seed=4)
    return Engine(str(path), device="cpu", max_context=160, contiguous_kv=False)
