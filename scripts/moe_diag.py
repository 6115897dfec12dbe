"""Step-by-step check of the grouped MoE GPU path against NumPy (run on the GPU machine):
route, align, gate/up, activation, down, combine (and, on the GEMM path, the gathered fp16
weights and the fp16 input rows), each step fed the GPU's own previous output so that the first
line marked BAD is where the path goes wrong.  python3 scripts/moe_diag.py [T ...]"""
import os
import sys
import tempfile

import numpy as np

from lite.backends.cpu import CPUBackend
from lite.backends.cuda import CUDABackend
from lite.gguf_file import GGUFFile
from lite.kernels import moe_cuda as mk
from lite.synth import synth

# Gate and up checked apart from the activation: the separate launches, not moe_mvw's gated form
# (decode's default, which writes only their activation).
os.environ["LITE_MOE_GATED"] = "0"
TOL = 2e-2     # relative to the largest expected magnitude: fp16 weights and inputs on the GEMM path


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)) if want.size else 0.0


def report(T, step, err):
    print(f"T={T:4d} {step:<28s} rel err {err:.2e} {'ok' if err < TOL else 'BAD'}")


def silu_mul(g, u):
    return g / (1 + np.exp(-g)) * u


def main(Ts):
    path = tempfile.mkdtemp() + "/qwen3moe-Q4_K.gguf"
    synth("qwen3moe", "tiny", "Q4_K", path, seed=3)
    g = GGUFFile(path)
    names = [n for n in g.tensors if n.startswith("blk.0.")]
    cpu, gpu = CPUBackend(g, names), CUDABackend(g, names)
    gpu.moe_grouped = True
    cp = gpu.cp
    n_expert = 8
    W = {n: np.stack([cpu._expert(f"blk.0.ffn_{n}_exps.weight", e) for e in range(n_expert)])
         for n in ("gate", "up", "down")}
    ws = [gpu.w[f"blk.0.ffn_{n}_exps.weight"] for n in ("gate", "up", "down")]
    for T in Ts:
        rng = np.random.default_rng(T)
        h = rng.standard_normal((T, 256)).astype(np.float32)
        ids, w = cpu.moe_route(h, "blk.0.ffn_gate_inp.weight", 2, True)
        k = ids.shape[1]
        with gpu.activate():
            gids, gw = gpu.moe_route(cp.asarray(h), "blk.0.ffn_gate_inp.weight", 2, True)
            report(T, "route ids (1 - agreement)", 1 - float((gids.get() == ids).mean()))
            report(T, "route weights", rel(gw.get(), w))
            dids = cp.asarray(ids.astype(np.int32))
            plan = gpu._moe_plan(dids, ws)
            flat = ids.reshape(-1)
            if plan["path"] == "pairs":
                rows = [(s, s // k, flat[s]) for s in range(flat.size)]
                pos = np.arange(flat.size)
            else:
                bm = plan["bm"]
                ref = mk.align_ref(ids, n_expert, bm)
                for key in ("blk_expert", "blk_rows", "pos", "used_list", "rank"):
                    report(T, f"align {key}", float(not np.array_equal(plan[key].get(), ref[key])))
                pos = ref["pos"]
                rows = [(p, ref["blk_rows"][p], ref["blk_expert"][p // bm]) for p in pos]
            gpu.moe_trace = tr = {}
            y = gpu._moe_run(plan, cp.asarray(h), dids, ws, "silu")
            gpu.moe_trace = None
            cp.cuda.runtime.deviceSynchronize()
            print(f"T={T:4d} path {plan['path']}, n {plan['n']}, blocks {plan['n_blocks']}")
            if plan["path"] == "gemm":
                used = np.unique(flat)
                report(T, "gathered up weights f16", rel(tr["wu16"].get()[:used.size].astype(np.float32)
                                                         .reshape(W["up"][used].shape), W["up"][used]))
                report(T, "gathered down weights f16", rel(tr["wd16"].get()[:used.size].astype(np.float32)
                                                           .reshape(W["down"][used].shape), W["down"][used]))
                xs = tr["xs"].get().astype(np.float32)
                report(T, "gathered x f16", rel(np.stack([xs[p] for p, _, _ in rows]),
                                                np.stack([h[t] for _, t, _ in rows])))
            gu = tr["gu"].get()
            report(T, "gate", rel(np.stack([gu[0][p] for p, _, _ in rows]),
                                  np.stack([W["gate"][e] @ h[t] for _, t, e in rows])))
            report(T, "up", rel(np.stack([gu[1][p] for p, _, _ in rows]),
                                np.stack([W["up"][e] @ h[t] for _, t, e in rows])))
            a = (tr["h16"] if "h16" in tr else tr["a"]).get().astype(np.float32)
            report(T, "activation", rel(np.stack([a[p] for p, _, _ in rows]),
                                        np.stack([silu_mul(gu[0][p], gu[1][p]) for p, _, _ in rows])))
            yh = y.get()
            report(T, "down", rel(np.stack([yh[p] for p, _, _ in rows]),
                                  np.stack([W["down"][e] @ a[p] for p, _, e in rows])))
            out = gpu.moe_experts(cp.asarray(h), 0, ids, w, "silu").get()
            report(T, "combine (vs GPU rows)", rel(out, mk.combine_ref(yh, pos, w)))
            report(T, "end to end (vs CPU)", rel(out, cpu.moe_experts(h, 0, ids, w, "silu")))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 5, 40, 100, 300])
