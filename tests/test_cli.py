"""The command line as a subprocess, on SmolLM2: bad input gives one line on stderr and a non-zero
exit, never a traceback; info, run, chat and bench. The flags from llama.cpp, in process on a tiny
synthetic model: tests/test_cli_flags.py."""
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFWriter

from conftest import real_model


def lite(*args, input=None):
    r = subprocess.run([sys.executable, "-m", "lite.cli.main", *args], capture_output=True,
                       text=True, input=input, timeout=600)
    return r.returncode, r.stdout, r.stderr


def assert_one_line_error(rc, err, *needles):
    assert rc != 0
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip() and "WARNING" not in ln]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def smollm2():
    return real_model("smollm2")


@pytest.fixture(scope="module")
def odd_arch(tmp_path_factory):
    p = tmp_path_factory.mktemp("m") / "odd.gguf"
    w = GGUFWriter(str(p), "mamba9")
    w.add_tensor("x.weight", np.zeros((2, 32), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return p


def test_missing_file():
    rc, _, err = lite("run", "-m", "/nonexistent/model.gguf", "-p", "hi")
    assert_one_line_error(rc, err, "no such file")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello, this is not a model\n")
    rc, _, err = lite("run", "-m", str(p), "-p", "hi")
    assert_one_line_error(rc, err, "not a GGUF file")


def test_truncated_file(tmp_path, smollm2):
    p = tmp_path / "cut.gguf"
    with open(smollm2, "rb") as f:
        p.write_bytes(f.read(5_000_000))
    rc, _, err = lite("run", "-m", str(p), "-p", "hi")
    assert_one_line_error(rc, err, "truncated")


def test_unknown_architecture(odd_arch):
    rc, _, err = lite("run", "-m", str(odd_arch), "-p", "hi")
    assert_one_line_error(rc, err, "unsupported architecture 'mamba9'", "llama")


def test_prompt_longer_than_context(smollm2):
    rc, _, err = lite("run", "-m", smollm2, "-c", "16", "-n", "4", "-p", "word " * 40, "--device", "cpu")
    assert_one_line_error(rc, err, "context of 16")


@pytest.mark.parametrize("flags,needle", [
    (["--temp", "-1"], "--temp"),
    (["-n", "0"], "n-predict"),
    (["--kv", "q3"], "--kv"),
    (["--device", "tpu"], "--device"),
    (["--top-p", "2"], "--top-p"),
    (["--layer-split", "3,x"], "--layer-split"),
    (["--bogus-flag"], "bogus"),
    (["--prefill", "512,1024"], "--prefill"),
])
def test_bad_flag_values(flags, needle):
    rc, _, err = lite("run", "-p", "hi", *flags)
    assert_one_line_error(rc, err, needle)


def test_bench_takes_a_list_of_prefill_chunks(tmp_path):
    import json
    path = tmp_path / "tiny.gguf"
    rc, _, err = lite("synth", "--arch", "llama", "--preset", "tiny", "--quant", "Q8_0", str(path))
    assert rc == 0, err
    rc, out, err = lite("bench", str(path), "-p", "48", "-n", "2", "-r", "1", "--device", "cpu",
                        "--prefill", "16,32", "--json")
    assert rc == 0, err
    rows = json.loads(out)
    assert [(r["test"], r["chunk"]) for r in rows] == [("pp48", 16), ("tg2 @ 48", 16),
                                                       ("pp48", 32), ("tg2 @ 48", 32)]


def test_bench_kernels_without_a_gpu_is_one_line():
    """`lite bench kernels` where no GPU is usable (CI; NUMBA_ENABLE_CUDASIM set counts too): one line
    saying why, not an internal error (it was `ModuleNotFoundError: cupy` before session 9)."""
    from lite.backends import cuda_unavailable_reason
    if cuda_unavailable_reason() is None:
        pytest.skip("a GPU is usable here: the benchmark would run")
    rc, _, err = lite("bench", "kernels")
    assert_one_line_error(rc, err, "needs a CUDA GPU")
    rc, _, err = lite("bench", "kernels", "--types", "Q4_K,IQ3_XXS_G4")    # known types: on to the GPU check
    assert_one_line_error(rc, err, "needs a CUDA GPU")


@pytest.mark.parametrize("args,needle", [(("kernels", "--types", "Q9_K"), "unknown GGUF quant type 'Q9_K'"),
                                         (("kernels", "--types", "Q4_K,TQ1_0"), "no GPU kernels for TQ1_0"),
                                         (("model.gguf", "--types", "Q4_K"), "--types goes with")])
def test_bench_kernel_types_are_checked(args, needle):
    rc, _, err = lite("bench", *args)
    assert_one_line_error(rc, err, needle)


def test_layer_split_must_cover_the_model(smollm2):
    rc, _, err = lite("run", "-m", smollm2, "-p", "hi", "--layer-split", "10,10", "--device", "cpu")
    assert_one_line_error(rc, err, "30 layers")


def test_info(smollm2):
    rc, out, err = lite("info", smollm2, "--tensors")
    assert rc == 0, err
    assert "architecture:  llama" in out
    assert "Q4_1" in out and "blk.29.ffn_down.weight" in out


def test_run_greedy_streams_text(smollm2):
    rc, out, err = lite("run", "-m", smollm2, "-p", "The capital of France is", "-n", "8",
                        "--temp", "0", "--device", "cpu", "--no-chat")
    assert rc == 0, err
    assert out.startswith("The capital of France is") and len(out) > len("The capital of France is")
    assert "generated 8 tokens" in err or "generated" in err


def test_out_of_memory_names_what_and_the_flag(smollm2):
    rc, _, err = lite("run", "-m", smollm2, "-p", "hi", "-c", "2000000000", "--device", "cpu")
    assert_one_line_error(rc, err, "KV cache", "--max-context")


def test_device_cuda_without_a_gpu_is_an_error_auto_falls_back(smollm2):
    from lite.backends import cuda_unavailable_reason
    if cuda_unavailable_reason() is None:
        pytest.skip("a GPU is usable here")
    rc, _, err = lite("run", "-m", smollm2, "-p", "hi", "-n", "2", "--device", "cuda")
    assert_one_line_error(rc, err, "--device cuda")
    rc, out, err = lite("run", "-m", smollm2, "-p", "hi", "-n", "2", "--temp", "0", "--no-chat")
    assert rc == 0 and out.startswith("hi")
    assert sum("running on the CPU" in ln for ln in err.splitlines()) == 1


def test_chat_two_turns_reuse_the_cached_conversation(smollm2):
    rc, out, err = lite("-v", "chat", "-m", smollm2, "--temp", "0", "-n", "12", "--device", "cpu",
                        input="What is 2+2?\nAnd times 3?\n")
    assert rc == 0, err
    assert len([ln for ln in out.splitlines() if ln.strip()]) >= 2
    turns = [ln for ln in err.splitlines() if "turn:" in ln]
    assert len(turns) == 2
    assert "(0 reused)" in turns[0] and "(0 reused)" not in turns[1]


def test_run_answers_in_the_chat_template_by_default(smollm2):
    """SmolLM2-Instruct given bare text ends its turn at once; as a user turn it answers."""
    rc, out, err = lite("run", "-m", smollm2, "Why is the sky blue?", "-n", "16", "--temp", "0",
                        "--device", "cpu")
    assert rc == 0, err
    assert len(out.strip()) > 20 and "generated 16 tokens" in err
    rc, out, err = lite("run", "-m", smollm2, "-p", "-", "-n", "16", "--temp", "0", "--device", "cpu",
                        input="Why is the sky blue?")
    assert rc == 0 and len(out.strip()) > 20, err


def test_run_help_explains_the_handoff_options():
    rc, out, err = lite("run", "--help")
    assert rc == 0, err
    text = " ".join(out.split())          # click wraps the help text
    assert "p2p (GPU to GPU, where every pair of neighbouring GPUs can reach each other)" in text
    assert "auto (p2p where it can, else host)" in text
    assert "overlaps the next chunk's compute" in text and "not implemented" not in text
