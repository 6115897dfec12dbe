"""The flags people bring from llama.cpp, in process, on a tiny synthetic model that keeps them fast:
their errors (one line naming the flag, exit 1), where the prompt comes from, seeds, -n -1, threads,
stop strings, bad weights, closed pipes and prompts that are not UTF-8; the CPU path imports no GPU
library; bench --config reaches the engine."""
import os
import subprocess
import sys

import numpy as np
import pytest

from lite.cli.main import main
from lite.files.gguf_file import GGUFFile
from lite.files.synth import synth
from conftest import real_model
from test_cli import assert_one_line_error, lite


# --- the flags from llama.cpp, in process, on a tiny synthetic model ---

TIMEOUT = 120


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    synth("llama", "tiny", "Q8_0", p)
    return str(p)


@pytest.fixture(scope="module")
def nan_model(tiny, tmp_path_factory):
    """The tiny model with one NaN written into a norm weight."""
    p = tmp_path_factory.mktemp("nan") / "nan.gguf"
    p.write_bytes(open(tiny, "rb").read())
    t = GGUFFile(p).tensors["blk.1.attn_norm.weight"]
    with open(p, "r+b") as f:
        f.seek(t.offset + 4 * 7)
        f.write(np.array([np.nan], np.float32).tobytes())
    return str(p)


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("flags,needle", [
    (["--temp", "nan"], "'--temp'"), (["--temp", "inf"], "'--temp'"), (["--temp", "-0.5"], "'--temp'"),
    (["--top-p", "nan"], "'--top-p'"), (["--top-p", "-1"], "'--top-p'"),
    (["--min-p", "inf"], "'--min-p'"), (["--min-p", "-0.1"], "'--min-p'"),
    (["--repeat-penalty", "nan"], "'--repeat-penalty'"), (["--repeat-penalty", "-1"], "'--repeat-penalty'"),
    (["--top-k", "-1"], "'--top-k'"), (["--seed", "-2"], "'--seed'"),
    (["-n", "-2"], "'-n' / '--n-predict'"), (["-n", "0"], "'-n' / '--n-predict'"),
    (["-c", "-1"], "'-c' / '--ctx-size'"), (["--ctx-size", "0"], "'-c' / '--ctx-size'"),
    (["-t", "0"], "'-t' / '--threads'"), (["--threads", "-4"], "'-t' / '--threads'"),
])
def test_bad_values_are_one_line_naming_the_flag(capsys, flags, needle):
    rc, out, err = cli(capsys, "run", "-p", "hi", *flags)
    assert rc == 1 and out == ""
    assert_one_line_error(rc, err, needle)


def test_unknown_model_name_lists_the_known_names(capsys):
    rc, _, err = cli(capsys, "run", "-m", "llama3", "-p", "hi")
    assert_one_line_error(rc, err, "unknown model 'llama3'", "smollm2", "gemma3")
    rc, _, err = cli(capsys, "run", "-m", "/no/such.gguf", "-p", "hi")
    assert_one_line_error(rc, err, "no such file", "smollm2")


def test_the_prompt_comes_from_one_place(capsys, tiny, tmp_path):
    rc, _, err = cli(capsys, "run", "-m", tiny, "hello", "-p", "hi")
    assert_one_line_error(rc, err, "give the prompt once")
    rc, _, err = cli(capsys, "run", "-m", tiny)
    assert_one_line_error(rc, err, "give a prompt")


def test_positional_prompt_file_prompt_and_p_give_the_same_answer(capsys, tiny, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text("Tell me a story")
    common = ["-m", tiny, "--device", "cpu", "--temp", "0", "-n", "6"]
    runs = [cli(capsys, "run", *common, "Tell", "me", "a", "story"),
            cli(capsys, "run", *common, "-p", "Tell me a story"),
            cli(capsys, "run", *common, "-f", f)]
    assert all(rc == 0 for rc, _, _ in runs), runs
    assert runs[0][1] == runs[1][1] == runs[2][1]


def test_seed_minus_one_is_random_and_a_seed_repeats(capsys, tiny):
    common = ["run", "-m", tiny, "--device", "cpu", "-n", "12", "--temp", "1.5", "--top-k", "0",
              "--top-p", "1", "--min-p", "0", "-p", "hi"]
    a = cli(capsys, *common, "--seed", "7")
    b = cli(capsys, *common, "--seed", "7")
    assert a[0] == 0 and a[1] == b[1]
    outs = {cli(capsys, *common, "--seed", "-1")[1] for _ in range(3)}
    assert len(outs) > 1               # three random seeds: not all the same text


def test_n_minus_one_runs_to_the_end_of_the_context(capsys, tiny):
    from lite import LLM
    llm = LLM(tiny, device="cpu", max_context=40)
    ids = llm.tokenize(llm.chat_prompt([{"role": "user", "content": "hi"}]))
    rc, _, err = cli(capsys, "run", "-m", tiny, "--device", "cpu", "-c", "40", "-n", "-1",
                     "--temp", "0", "-p", "hi")
    assert rc == 0, err
    assert int(err.split("generated ")[1].split()[0]) <= 40 - len(ids)   # the context, or EOS
    llm.engine.tokenizer.eog_ids = frozenset()       # no end token: exactly the context's room
    assert len(list(llm.stream_ids(ids, max_tokens=-1, temperature=0))) == 40 - len(ids)


def test_threads_limit_the_blas_pool(capsys, tiny):
    from threadpoolctl import threadpool_info
    rc, _, err = cli(capsys, "run", "-m", tiny, "--device", "cpu", "-t", "1", "-n", "2", "-p", "hi")
    assert rc == 0, err
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 1 for p in blas)


def test_stop_string_split_across_tokens_never_shows(capsys, tiny):
    from lite import LLM
    llm = LLM(tiny, device="cpu")
    prompt = llm.chat_prompt([{"role": "user", "content": "hi"}])
    pieces = list(llm.stream(prompt, max_tokens=24, temperature=0))
    full = "".join(pieces)
    i = next(k for k in range(1, len(pieces) - 1) if pieces[k] and pieces[k + 1])
    stop = pieces[i][-1] + pieces[i + 1][:1]           # spans the boundary of two tokens
    want = full[:full.index(stop)]
    assert llm.generate(prompt, max_tokens=24, temperature=0, stop=[stop]) == want
    assert llm.last_stats.stop_reason == "stop"
    rc, out, err = cli(capsys, "run", "-m", tiny, "--device", "cpu", "--temp", "0", "-n", "24",
                       "-p", "hi", "--stop", "never-there", "--stop", stop)
    assert rc == 0, err
    assert out == want + "\n"


def test_no_chat_completes_the_text_and_echoes_it(capsys, tiny):
    rc, out, err = cli(capsys, "run", "-m", tiny, "--device", "cpu", "--temp", "0", "-n", "4",
                       "--no-chat", "-p", "Once upon")
    assert rc == 0, err
    assert out.startswith("Once upon") and len(out) > len("Once upon\n")


def test_interactive_keeps_the_history(tiny):
    r = subprocess.run([sys.executable, "-m", "lite.cli.main", "-v", "run", "-i", "-m", tiny,
                        "--device", "cpu", "--temp", "0", "-n", "6", "first"],
                       input="second\n", capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    turns = [ln for ln in r.stderr.splitlines() if "turn:" in ln]
    assert len(turns) == 2 and "(0 reused)" in turns[0] and "(0 reused)" not in turns[1]


def test_nan_weights_stop_with_one_line_and_verify_names_the_tensor(nan_model):
    for temp in ("0", "0.8"):
        rc, out, err = lite("run", "-m", nan_model, "--device", "cpu", "--temp", temp, "-p", "hi")
        assert_one_line_error(rc, err, "logits not finite at step 0", "lite info --verify")
        assert rc == 1 and out == ""
    rc, out, err = lite("info", "--verify", nan_model)
    assert_one_line_error(rc, err, "blk.1.attn_norm.weight")
    assert "blk.1.attn_norm.weight (F32): 1 NaN, 0 inf values" in out


def test_verify_a_good_file(capsys, tiny):
    rc, out, err = cli(capsys, "info", "--verify", tiny)
    assert rc == 0, err
    assert "39 tensors checked" in out and "all good" in out


def test_block_count_beyond_the_tensors_names_the_missing_layer(tiny, tmp_path):
    data = bytearray(open(tiny, "rb").read())
    key = b"llama.block_count"
    at = data.index(key) + len(key)
    assert data[at:at + 8] == bytes([4, 0, 0, 0, 4, 0, 0, 0])     # uint32 type, value 4
    data[at + 4] = 6
    p = tmp_path / "short.gguf"
    p.write_bytes(bytes(data))
    rc, _, err = lite("run", "-m", str(p), "--device", "cpu", "-p", "hi")
    assert_one_line_error(rc, err, "block_count is 6", "layer 4 (blk.4.*)")


def test_a_prompt_that_is_not_utf8_is_a_clear_error(tiny, tmp_path):
    f = tmp_path / "latin1.txt"
    f.write_bytes("café".encode("latin-1"))
    rc, _, err = lite("run", "-m", tiny, "-f", str(f))
    assert_one_line_error(rc, err, "is not valid UTF-8", "latin1.txt")
    env = dict(os.environ, LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    r = subprocess.run([sys.executable, "-m", "lite.cli.main", "run", "-m", tiny, "-p",
                        os.fsencode("caf") + b"\xe9"], env=env, capture_output=True, timeout=TIMEOUT)
    assert_one_line_error(r.returncode, r.stderr.decode(), "the prompt (-p) is not valid UTF-8")
    r = subprocess.run([sys.executable, "-m", "lite.cli.main", "run", "-m", tiny, "--device", "cpu",
                        "-n", "8", "-p", "café ünïcode"], env=env, capture_output=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr                # UTF-8 under the C locale works, output too


def test_nothing_is_printed_before_a_context_error(capsys, tiny):
    rc, out, err = cli(capsys, "run", "-m", tiny, "--device", "cpu", "--no-chat", "-c", "8",
                       "-n", "4", "-p", "word " * 20)
    assert out == ""
    assert_one_line_error(rc, err, "context of 8")


def test_a_closed_pipe_ends_quietly(tmp_path):
    model = real_model("smollm2")
    cmd = (f"{sys.executable} -m lite.cli.main run -m {model} --device cpu --no-chat --temp 0 "
           f"-n 64 -p 'The capital of France is' 2>{tmp_path / 'err'} | head -c 10; "
           f"exit ${{PIPESTATUS[0]}}")
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=TIMEOUT)
    assert r.stdout == b"The capita"
    assert (tmp_path / "err").read_text() == ""
    assert r.returncode == 0


def test_the_cpu_path_imports_no_gpu_library(tiny):
    code = ("import sys; from lite.cli.main import main; "
            f"a = main(['run', '-m', {tiny!r}, '--device', 'cpu', '-n', '2', '-p', 'hi']); "
            f"b = main(['info', '--verify', {tiny!r}]); "
            "print(a, b, sorted({m.split('.')[0] for m in sys.modules} & {'numba', 'cupy', 'llvmlite'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "0 0 []"


def test_bench_config_reaches_the_engine(capsys, tiny, monkeypatch):
    import lite.bench
    seen = []
    real = lite.bench.Engine

    def engine(*a, **kw):
        seen.append(kw["config"])
        return real(*a, **kw)
    monkeypatch.setattr(lite.bench, "Engine", engine)
    rc, out, err = cli(capsys, "bench", tiny, "-p", "8", "-n", "2", "-r", "1", "--device", "cpu",
                       "--config", "pdl=off,iq3-layout=groups4,int8_dot_types=Q4_K+q6_k")
    assert rc == 0, err
    assert (seen[0].pdl, seen[0].iq3_layout, seen[0].int8_dot_types) == (False, "groups4", ("Q4_K", "Q6_K"))
    assert "pp8" in out


def test_serve_config_reaches_the_engine(capsys, tiny, monkeypatch):
    import lite.server.launch
    seen = []
    monkeypatch.setattr(lite.server.launch, "serve", lambda *a, **kw: seen.append(kw["config"]))
    rc, out, err = cli(capsys, "serve", tiny, "--device", "cpu", "--config", "paged-flash=on")
    assert rc == 0, err
    assert seen[0].paged_flash and not seen[0].flash_attention_256
    rc, out, err = cli(capsys, "serve", tiny, "--config", "paged_flash=maybe")
    assert rc != 0 and len(seen) == 1
    assert len(err.strip().splitlines()) == 1 and "paged_flash takes on or off" in err, err


@pytest.mark.parametrize("setting,needle", [
    ("nonsense=1", "unknown setting 'nonsense=1'"), ("pdl=maybe", "pdl takes on or off"),
    ("expert_full_layer=many", "expert_full_layer takes a int"), ("pdl", "unknown setting 'pdl'"),
    ("delta_rule_mma=on", "delta_rule_mma takes one of off, tf32, 3xtf32"),
])
def test_bench_config_bad_setting_is_one_line(capsys, tiny, setting, needle):
    rc, out, err = cli(capsys, "bench", tiny, "-p", "8", "-n", "2", "-r", "1", "--device", "cpu",
                       "--config", setting)
    assert rc != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err
