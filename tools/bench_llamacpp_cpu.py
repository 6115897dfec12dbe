"""The peer figure for `lite bench MODEL --device cpu`: llama.cpp (llama-cpp-python) on the same
machine, same prompt length and decode count, median of repetitions, a unique nonce per prompt.

    /tmp/llvenv2/bin/python tools/bench_llamacpp_cpu.py MODEL.gguf 128 64 3
"""
import statistics
import sys
import time

import llama_cpp
import numpy as np


def main():
    path, n_prompt, n_gen, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_prompt + n_gen + 8, n_batch=512, n_threads=2,
                          verbose=False)
    pp, tg = [], []
    for rep in range(reps + 1):
        ids = [int(x) for x in np.random.default_rng(rep + 1).integers(100, 32000, n_prompt)]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        for _ in range(n_gen):
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t2 = time.perf_counter()
        if rep:
            pp.append(n_prompt / (t1 - t0))
            tg.append(n_gen / (t2 - t1))
    print(f"llama.cpp {llama_cpp.__version__} CPU, 2 threads: pp{n_prompt} {statistics.median(pp):.1f} "
          f"tok/s, tg{n_gen} {statistics.median(tg):.1f} tok/s (median of {reps})")


if __name__ == "__main__":
    main()
