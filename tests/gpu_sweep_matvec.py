"""GPU only (not collected by pytest): the staged matvec kernels (kernels/matvec_staged.py) and the
half2 kernel (kernels/matvec_half.py, Q4_K/Q6_K) against the register kernels, for correctness and
bandwidth, on full-size shapes.

    source scripts/device_setup.sh; python3 tests/gpu_sweep_matvec.py [--types Q4_K,IQ3_XXS]
    python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K --variants mvh8,mvh4,mvh8c64,mvh4c64   # half2
    python3 tests/gpu_sweep_matvec.py --types IQ3_XXS --variants mvp8,v280,v281,v240,v241,v2p8,v2p4
    python3 tests/gpu_sweep_matvec.py --types Q4_K,Q6_K --variants mv20,mv40,mv41,mv160 \
        --shapes 6144x4096,28672x4096,4096x4096,4096x14336,128256x4096   # the 8B decode step's shapes

For each type, one module holds the register kernel and every variant (staged "mvs", persistent
"mvp"); each variant's n=1 output must match the register kernel's (the register kernels are
checked against the Numba twins and float64 by tests/test_kernels_*.py): to 1e-5 of the largest
output, the half2 kernel to HALF_TOL (fp16 products; tests/test_kernels_matvec_half.py has the
per-output bound against float64).
Times are from captured CUDA graphs rotating through enough weight copies that the 50 MB L2 cannot
serve them; GB/s = weight bytes / time, % against the device copy measured in the same run.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench_matvec import gtime, stream  # noqa: E402  (the graph timer and its stream: one copy)
from kernel_blocks import random_blocks  # noqa: E402

from lite.kernels import matvec_cuda as mc, matvec_half as mh, matvec_iq as mi, matvec_q8 as mq, matvec_staged as ms, quant_info  # noqa: E402
from lite.kernels import iq3_groups, matvec_q8_iq3 as miq3  # noqa: E402

SHAPES = [(4096, 14336), (14336, 4096), (4096, 4096)]
VARIANTS = [("mvs", 8, 3), ("mvs", 4, 3), ("mvp", 2), ("mvp", 4), ("mvp", 8)]
# matvec_half's kernel where it supports the type (Q4_K, Q6_K; 64-weight chunks Q4_K only); same
# grid as the register kernel. Labels mvh8, mvh4, mvh8c64, mvh4c64.
HALF_VARIANTS = [("mvh", 8), ("mvh", 4), ("mvh", 8, 64), ("mvh", 4, 64)]
HALF_TOL = 3e-3
Q8_TOL = 1e-4     # mvq: x within max|x of its run| / 64,516 (matvec_q8); its float64 test is tighter per output
# The register kernel at other shapes of CTA (rows, prefetch) than CONFIG's: CONFIG was chosen on the
# two large shapes; the decode step's smaller products (q/k/v 6144x4096, o 4096x4096) may want more
# CTAs. Labels mv20, mv40, mv41, mv160.
REG_VARIANTS = [("mv", 2, 0), ("mv", 4, 0), ("mv", 4, 1), ("mv", 16, 0)]
# The register kernel with the two-instruction dot (matvec_cuda FAST_DOT, TQ4_KH; label mvf80): 2
# instructions a weight where mv has 3, the same loads and registers; results within ~1e-6.
REG_VARIANTS += [("mvf", 8, 0)]
# Session 7: other CTA shapes for mvf and for Q6_K (labels mvf40, mvf41, mvf20, mvf160, mv80, mv81).
REG_VARIANTS += [("mvf", 4, 0), ("mvf", 4, 1), ("mvf", 2, 0), ("mvf", 16, 0), ("mv", 8, 0), ("mv", 8, 1)]
# Q4_K on dp4a over x in two int8 parts (kernels/matvec_q8.py, opt-in, session 7): (rows, prefetch).
# Label mvq80 times the quantizer and the product together (what a decode step would pay), mvq80p
# the product alone on x quantized beforehand.
Q8_VARIANTS = [(8, 0), (4, 0), (4, 1), (2, 0), (16, 0)]
# IQ3_XXS v2 (kernels/matvec_iq_v2.py, opt-in, first GPU run): ("v2", rows, prefetch) on matvec_cuda's
# mv loop (mv_rows), ("v2p", rows) on the persistent loop. Labels v280, v281, v240, v241, v2p8, v2p4.
IQ_V2_VARIANTS = [("v2", 8, 0), ("v2", 8, 1), ("v2", 4, 0), ("v2", 4, 1), ("v2p", 8), ("v2p", 4)]
# IQ3_XXS mvq with its tables elsewhere (session 8; matvec_q8's TIQ3_XXSQV<GC, SC>): (rows, prefetch
# or "p" for the persistent loop, GC, SC). Labels mvq40t11 (mv_iq2, 4 rows, no prefetch, 1 grid copy
# and the masks in shared memory), mvqp4t42 (persistent, 4 rows, 4 copies, masks computed); a
# trailing p: the product alone, as mvq80p.
IQ3_Q8_VARIANTS = [(r, p, gc, sc, False) for r, p in ((4, 0), (8, 0), (4, "p"), (8, "p"), (2, 0), (4, 1))
                   for gc, sc in ((0, 0), (1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (4, 2), (0, 2), (16, 1), (32, 2))]
# The regrouped layout (matvec_q8_iq3.TIQ3_XXSG over iq3_groups.repack's bytes, cols a multiple of
# 1024; the GPU backend's since session 9): labels with g for t, e.g. mvq40g12 (the default), mvq40g322.
IQ3_Q8_VARIANTS += [(r, p, gc, sc, True) for r, p in ((4, 0), (8, 0), (2, 0), (4, 1), (4, "p"))
                    for gc, sc in ((1, 2), (0, 2), (32, 2), (0, 0))]
# Session 11: mv_iq2 with P = 2 (matvec_cuda.mv_rows_any: the last half trip spread over all threads,
# half the rows each): labels mvq42g12 (the default since call 14).
IQ3_Q8_VARIANTS += [(r, 2, 1, 2, True) for r in (2, 4, 8)]
# Session 11, after its device time: the sums to floats without I2F (SC = 3) or combined as integers
# first (SC = 4): labels mvq42g13, mvq42g14, mvq40g13, mvq40g14.
IQ3_Q8_VARIANTS += [(4, p, 1, sc, True) for p in (0, 2) for sc in (3, 4)]
# Session 12: 16 / 32 grid copies with the fill's loads first (matvec_q8_iq3's init; before, the fill
# waited a load a store): labels mvq42g322, mvq82g322, mvq42g162, ...
IQ3_Q8_VARIANTS += [(r, p, gc, 2, True) for r in (4, 8) for p in (0, 2) for gc in (16, 32)]
# Session 10 (calls 2-6): the regrouped layout's signs placed for PRMT (labels mvq..s.. then, now the
# g labels' layout).
# And matvec_staged's mvs (cp.async stages in shared memory) over the signed layout: (rows, stages),
# labels e.g. mvqs43 (TIQ3_XXSG<1, 2>).
# Session 10's mvm (rows in static shared memory by bulk copies: labels mvqm..) lost in session 11
# (calls 1-2) and is deleted: mvt below covers it.
# Session 11: kernels/matvec_tma.py's mvt (teams of 128 threads, rows in dynamic shared memory, the grid
# tables filled once a CTA) over IQ3_XXS_G4: (rows a team, teams, grid copies, D, X), labels mvqw8x4g1;
# D = 1 the compute alone (no copies: mvqw8x4g1d1), D = 2 the copies alone (..d2); X = 1 x's records
# copied into shared memory (..x1), X = 2 made there by the CTA, no qx launch (..x2). Figures in
# BENCHMARKS, session 11 (16 and 32 grid copies, 2 teams or 16 rows a team: slower, and out of the list).
IQ3_TEAMS = [(rr, tr, 1, d, xm) for rr, tr in ((8, 4), (4, 8)) for d in (0, 1, 2) for xm in (0, 1, 2)]
IQ3_TEAMS += [(6, 4, 1, d, 0) for d in (0, 1)]   # session 12: 24 rows a CTA (less shared memory, more L1)
IQ3_TEAMS += [(8, 4, gc, 0, xm) for gc in (16, 32) for xm in (0, 1)]   # session 12: the copies filled fast
# mvt<TIQ3_XXSW<SC>> over iq3_groups.repack12's layout (12-bit fields through a 4096-word table): (rows a
# team, teams, D, X), labels mvqv8x4, mvqv8x4d1, ... (X > 0 does not fit at 14336 columns: 32 rows, x's
# records and the 16 KB table pass 227 KB).
IQ3_W12 = [(rr, tr, d, xm, 2) for rr, tr in ((8, 4), (4, 8)) for d in (0, 1, 2) for xm in (0, 1, 2)]
IQ3_W12 += [(6, 4, d, 0, 2) for d in (0, 1)]
# and both over SC = 3 (the sums to floats without I2F): labels mvqw8x4g1s3, mvqw8x4g1d1s3, mvqv8x4s3, ...
IQ3_TEAMS_SC3 = [(8, 4, 1, d, 0) for d in (0, 1)]
IQ3_W12 += [(8, 4, d, 0, 3) for d in (0, 1)]
DIAGNOSTIC = set()   # labels whose results are not the product (mvt's D > 0): timed, not checked
IQ3_STAGED_VARIANTS = [(4, 3), (4, 4), (8, 3), (2, 4), (4, 6), (8, 2)]
# Session 10 also timed, and deleted after losing (BENCHMARKS, session 10): mv_iq3t (teams of 128
# threads sharing a CTA's 32 grid copies; labels mvqt...), mv_body with balanced trips (mvqb40s...)
# mv_iq2 held to 9 CTAs an SM so that prefetch fits 56 registers (mvqb419: call 14), and the first
# trip's weights loaded before the PDL wait (mvqe4, mvqe2: call 15).
L2_ROTATE_BYTES = 256 << 20


# "read": a plain read of the same weight bytes (16-byte loads, 4 in flight a thread, one wave of
# CTAs), timed the same way: what a product of these bytes could take at best at this size (the
# launch, ramp and tail included), beside the large copy's bandwidth.
C_READ = r"""
extern "C" __global__ void __launch_bounds__(256) read16(const uint4* __restrict__ p, long long n, unsigned* out) {
    unsigned acc = 0;
    const long long step = (long long)gridDim.x * 256;
    long long i = blockIdx.x * 256LL + threadIdx.x;
    for (; i + 3 * step < n; i += 4 * step) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + step), c = __ldg(p + i + 2 * step), d = __ldg(p + i + 3 * step);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n; i += step) acc ^= __ldg(p + i).x;
    if (acc == 0x9e3779b9u) out[0] = acc;     // (keeps the loads; almost never true)
}
"""


def read_launcher(dev):
    k = cp.RawKernel(C_READ, "read16")
    sms = cp.cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"]
    sink = cp.zeros(1, cp.uint32)
    return lambda w, x, o, rows, cols: k((sms * 8,), (256,), (w, np.int64(w.size // 16), sink))


def copy_bandwidth():
    a = cp.empty(512 << 20, cp.uint8)
    b = cp.empty_like(a)
    el = 2 * a.nbytes / gtime([lambda: b.__setitem__(slice(None), a)], reps=5) / 1e9
    mcp = 2 * a.nbytes / gtime([lambda: cp.cuda.runtime.memcpyAsync(
        b.data.ptr, a.data.ptr, a.nbytes, cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)], reps=5) / 1e9
    return max(el, mcp)


def _label(v):
    return "".join(map(str, v[:2])) + "".join(f"c{p}" for p in v[2:]) if v[0] == "mvh" else "".join(map(str, v))


def launchers(qt, dev, only=None):
    """{label: launch(w, x, out, rows, cols)} (n = 1) for the register kernel and each variant
    (those labelled in `only`, if given)."""
    info = quant_info(qt)
    cpb = info.block_elems // 32
    out = {}
    variants = [v for v in VARIANTS if only is None or _label(v) in only]
    halves = [v for v in HALF_VARIANTS if mh.supports(qt, v) and (only is None or _label(v) in only)]
    regs = [v for v in REG_VARIANTS if qt in mc.CONFIG and (only is None or _label(v) in only)
            and (v[0] != "mvf" or qt in mc.FAST_DOT)]
    if qt in mc.CONFIG:
        names = ([mc.kernel_name(qt, 1, *mc.CONFIG[qt])] + [mc.kernel_name(qt, 1, *v) for v in variants]
                 + [mc.kernel_name(qt, 1, *v) for v in halves] + [mc.kernel_name(qt, 1, *v) for v in regs])
        mod = cp.RawModule(code=mc.c_source(half=bool(halves)), options=("--std=c++17",), name_expressions=names)
        get = mod.get_function
        reg = mc.CONFIG[qt]
        k = get(names[0])
        out["register"] = lambda w, x, o, rows, cols: k(((rows + reg[0] - 1) // reg[0],), (128,),
                                                        (w, x, o, np.int32(rows), np.int32(cols)))
    else:
        out["register"] = lambda w, x, o, rows, cols: mi.launch_cuda(qt, w, x, o, rows, cols, None, config=("reg",))
        names = [None] + [mi.kernel_name(qt, 1, v) for v in variants]
        mod = mi._raw_module(dev, tuple((qt, 1, v) for v in variants))
        get = mod.get_function
    if qt == "IQ3_XXS":
        from lite.kernels import matvec_iq_v2 as v2
        for v in IQ_V2_VARIANTS:
            if only is not None and _label(v) not in only:
                continue
            f = v2.get_function(dev, 1, v)
            print(f"  {qt} {_label(v)}: regs {getattr(f, 'num_regs', '?')}, local {getattr(f, 'local_size_bytes', '?')}, "
                  f"smem {getattr(f, 'shared_size_bytes', '?')}", flush=True)
            out[_label(v)] = lambda w, x, o, rows, cols, v=v: v2.launch(w, x, o, rows, cols, v)
    for v, name in zip(halves, names[1 + len(variants):]):
        f = get(name)
        print(f"  {qt} {_label(v)}: regs {getattr(f, 'num_regs', '?')}, local {getattr(f, 'local_size_bytes', '?')}", flush=True)
        out[_label(v)] = (lambda w, x, o, rows, cols, f=f, r=v[1]:
                          f(((rows + r - 1) // r,), (128,), (w, x, o, np.int32(rows), np.int32(cols))))
    for v, name in zip(regs, names[1 + len(variants) + len(halves):]):
        f = get(name)
        print(f"  {qt} {_label(v)}: regs {getattr(f, 'num_regs', '?')}, local {getattr(f, 'local_size_bytes', '?')}", flush=True)
        out[_label(v)] = (lambda w, x, o, rows, cols, f=f, r=v[1]:
                          f(((rows + r - 1) // r,), (128,), (w, x, o, np.int32(rows), np.int32(cols))))
    if qt in mq.TYPES:
        for r, p in Q8_VARIANTS:
            label = f"mvq{r}{p}"
            if only is not None and label not in only and label + "p" not in only:
                continue
            quant, f = mq.functions(dev, qt, 1, r, p)
            print(f"  {qt} {label}: regs {getattr(f, 'num_regs', '?')}, local {getattr(f, 'local_size_bytes', '?')}; "
                  f"qx regs {getattr(quant, 'num_regs', '?')}", flush=True)
            xq = {}   # per x: its quantized records, made by the mvq launch (the p label reuses them)

            def both(w, x, o, rows, cols, r=r, p=p, xq=xq):
                buf = xq.setdefault(id(x), (x, cp.empty_like(x)))[1]
                mq.launch(qt, w, x, buf, o, rows, cols, (r, p))

            def product(w, x, o, rows, cols, f=f, r=r, xq=xq, both=both):
                if id(x) not in xq:
                    both(w, x, o, rows, cols)
                f(((rows + r - 1) // r,), (128,), (w, xq[id(x)][1], o, np.int32(rows), np.int32(cols)))
            out[label] = both
            out[label + "p"] = product
    if qt == "IQ3_XXS":
        out.update(_iq3_q8(dev, only))
    if only is not None and "read" in only:
        out["read"] = read_launcher(dev)
    for v, name in zip(variants, names[1:]):
        f = get(name)
        smem = ms.smem_bytes(info.type_size, cpb, *v[1:]) if v[0] == "mvs" else 0
        label = _label(v)
        print(f"  {qt} {label}: grid cap {ms.prepare(f, smem, dev)}, regs {getattr(f, 'num_regs', '?')}, smem {smem}", flush=True)
        out[label] = (lambda w, x, o, rows, cols, f=f, smem=smem, r=v[1]:
                      ms.launch(f, smem, dev, rows, r, (w, x, o, np.int32(rows), np.int32(cols))))
    return out


def _iq3_q8(dev, only):
    """{label: launch} for IQ3_Q8_VARIANTS named in `only` (all when None): qx then the product, and
    (trailing p) the product alone on x quantized by the first."""
    from lite.kernels import pdl
    out, todo = {}, []
    for r, p, gc, sc, grouped in IQ3_Q8_VARIANTS:
        label = f"mvq{'p' + str(r) if p == 'p' else f'{r}{p}'}{'g' if grouped else 't'}{gc}{sc}"
        st = miq3.struct_name((gc, sc), grouped)
        if only is None or label in only or label + "p" in only:
            todo.append((label, r, p, grouped, ms.persistent_name(st, 1, r) if p == "p"
                         else f"mv_iq2<{st}, 1, {r}, {p}>"))
    for (rr, tr, gc, d, xm), sc in [(t, 2) for t in IQ3_TEAMS] + [(t, 3) for t in IQ3_TEAMS_SC3]:
        label = f"mvqw{rr}x{tr}g{gc}" + (f"d{d}" if d else "") + (f"x{xm}" if xm else "") + (f"s{sc}" if sc != 2 else "")
        if d:
            DIAGNOSTIC.update((label, label + "p"))
        if only is None or label in only or label + "p" in only:
            todo.append((label, rr * tr, ("w", tr, xm), True,
                         f"mvt<{miq3.struct_name((gc, sc), True)}, 1, {rr}, {tr}, {d}, {xm}, TIQ3_XXS, 20>"))
    for rr, tr, d, xm, sc in IQ3_W12:
        label = f"mvqv{rr}x{tr}" + (f"d{d}" if d else "") + (f"x{xm}" if xm else "") + (f"s{sc}" if sc != 2 else "")
        if d:
            DIAGNOSTIC.update((label, label + "p"))
        if only is None or label in only or label + "p" in only:
            todo.append((label, rr * tr, ("w", tr, xm), "w12", f"mvt<TIQ3_XXSW<{sc}>, 1, {rr}, {tr}, {d}, {xm}, TIQ3_XXS, 20>"))
    for r, stages in IQ3_STAGED_VARIANTS:
        label = f"mvqs{r}{stages}"
        if only is None or label in only or label + "p" in only:
            todo.append((label, r, ("s", stages), True, f"mvs<{miq3.struct_name((1, 2), True)}, 1, {r}, {stages}>"))
    if not todo:
        return out
    quant_name = mq.quantize_name("IQ3_XXS")
    if os.environ.get("LITE_SWEEP_QXE"):   # session 11: qxe, the quantizer that lets the product launch first
        quant_name = quant_name.replace("qx<", "qxe<")
    mod = mq._module(dev, "IQ3_XXS", (quant_name,) + tuple(t[-1] for t in todo), pdl.source_head())
    quant = mod.get_function(quant_name)
    packed = {}   # id(raw weights) -> (raw, the same repacked by iq3_groups.repack): made on a first call, outside capture
    for label, r, p, grouped, name in todo:
        f = mod.get_function(name)
        cap = ms.prepare(f, 0, dev) if p == "p" else None
        smem = 0
        if isinstance(p, tuple) and p[0] == "s":   # mvs: its stages in dynamic shared memory
            smem = ms.smem_bytes(iq3_groups.GROUP_BYTES // 4, 8, r, p[1])
            cap = ms.prepare(f, smem, dev)
        print(f"  IQ3_XXS {label}: regs {getattr(f, 'num_regs', '?')}, smem {getattr(f, 'shared_size_bytes', '?')}"
              + (f", grid cap {cap}" if cap else ""), flush=True)
        xq = {}

        def product(w, x, o, rows, cols, f=f, r=r, p=p, cap=cap, xq=xq, grouped=grouped, smem=smem):
            if grouped:
                key = (id(w), grouped == "w12")
                if key not in packed:   # (not setdefault: its default, the repack, runs on every call)
                    packed[key] = (w, (iq3_groups.repack12 if grouped == "w12" else iq3_groups.repack)(w, rows, cols))
                w = packed[key][1]
            grid = min(-(-rows // r), cap) if cap else -(-rows // r)
            if isinstance(p, tuple) and p[0] == "w":   # mvt: r rows a CTA in dynamic shared memory
                rb = iq3_groups.nbytes(1, cols)
                if rb % 16 or -(-cols // 4096) > 16:
                    raise ValueError(f"mvt needs 16-aligned rows of at most 16 trips: cols={cols}")
                nbytes = r * rb + (cols // 32 * 80 if p[2] else 0)   # X > 0: x's records too (n = 1)
                if f.max_dynamic_shared_size_bytes < nbytes:   # (past 48 KB with the static tables: opt in)
                    f.max_dynamic_shared_size_bytes = nbytes
                    # session 12: LITE_SWEEP_CARVEOUT=min asks for the least shared memory that fits (more L1)
                    f.preferred_shared_memory_carveout = (100 if os.environ.get("LITE_SWEEP_CARVEOUT") != "min"
                                                          else min(100, -(-(nbytes + 17 * 1024) * 100 // (228 * 1024))))
                pdl.call(f, (grid,), (128 * p[1],), (w, x if p[2] == 2 else xq[id(x)][1], o, np.int32(rows), np.int32(cols)),
                         shared_mem=nbytes)
            elif smem:
                if iq3_groups.nbytes(1, cols) % 16:   # mvs copies 16-byte pieces of whole rows
                    raise ValueError(f"mvs needs 16-aligned rows: cols={cols} is not a multiple of 2048")
                f((grid,), (128,), (w, xq[id(x)][1], o, np.int32(rows), np.int32(cols)), shared_mem=smem)
            else:
                pdl.call(f, (grid,), (128,), (w, xq[id(x)][1], o, np.int32(rows), np.int32(cols)))

        def both(w, x, o, rows, cols, quant=quant, xq=xq, product=product, p=p):
            buf = xq.setdefault(id(x), (x, cp.empty_like(x)))[1]
            if not (isinstance(p, tuple) and p[0] == "w" and p[2] == 2):   # (mvt X=2 quantizes x itself)
                pdl.call(quant, mq.quantize_grid(*x.shape), (128,), (x, buf, np.int32(x.shape[1])))
            product(w, x, o, rows, cols)

        def alone(w, x, o, rows, cols, both=both, product=product, xq=xq):
            (product if id(x) in xq else both)(w, x, o, rows, cols)
        out[label] = both
        out[label + "p"] = alone
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,IQ3_XXS,Q4_0,Q5_K")
    ap.add_argument("--variants", default=None, help="labels to time beside the register kernel "
                    "(e.g. mvh8,mvh4,mvs83,mvp4,mv40); default: all")
    ap.add_argument("--shapes", default=None, help="rows x cols list, e.g. 6144x4096,28672x4096 "
                    "(default: " + ",".join(f"{r}x{c}" for r, c in SHAPES) + ")")
    args = ap.parse_args()
    shapes = SHAPES if args.shapes is None else [tuple(int(v) for v in s.split("x"))
                                                 for s in args.shapes.split(",")]
    dev = cp.cuda.runtime.getDevice()
    copy_bw = copy_bandwidth()
    print(f"copy {copy_bw:.0f} GB/s", flush=True)
    if args.variants and "read" in args.variants.split(","):   # the kernel table's copy (lite bench kernels)
        from lite.kernels import bench as kb
        print(f"copy-vec16 {kb.copy16_bandwidth(stream):.0f} GB/s", flush=True)
    rng = np.random.default_rng(0)
    res = {"copy_GBs": copy_bw, "rows": []}
    bad = 0
    for qt in args.types.split(","):
        info = quant_info(qt)
        fns = launchers(qt, dev, None if args.variants is None else set(args.variants.split(",")))
        # correctness (n = 1) against the register kernel; ragged rows: tests/test_kernels_*.py
        for rows, cols in shapes:
            host = random_blocks(qt, rows * cols // info.block_elems, rng)
            w = cp.asarray(host)
            x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
            ref = cp.empty((1, rows), cp.float32)
            fns["register"](w, x, ref, rows, cols)
            ref = ref.get().astype(np.float64)
            scale = np.abs(ref).max() + 1e-30
            skip = set()
            for label, f in fns.items():
                if label == "read":
                    continue
                o = cp.full((1, rows), np.nan, cp.float32)
                try:
                    f(w, x, o, rows, cols)
                except (ValueError, RuntimeError, cp.cuda.driver.CUDADriverError) as e:   # e.g. mvt's rows do not fit
                    print(f"skip {qt} {rows}x{cols} {label}: {e}", flush=True)
                    skip.add(label)
                    continue
                if label in DIAGNOSTIC:
                    continue
                d = float(np.max(np.abs(o.get() - ref)) / scale)
                if not d < (HALF_TOL if label.startswith("mvh") else Q8_TOL if label.startswith("mvq") else 1e-5):
                    bad += 1
                    print(f"MISMATCH {qt} {rows}x{cols} {label}: {d}", flush=True)
            copies = [w] + [cp.asarray(host) for _ in range(max(1, math.ceil(L2_ROTATE_BYTES / host.size)) - 1)]
            o = cp.empty((1, rows), cp.float32)
            line = []
            for label, f in fns.items():
                if label in skip:
                    continue
                for w_ in copies:   # first calls outside capture (the grouped labels repack a copy then)
                    f(w_, x, o, rows, cols)
                t = gtime([lambda w=w_, f=f: f(w, x, o, rows, cols) for w_ in copies], reps=8)
                gbs = host.size / t / 1e9
                res["rows"].append(dict(type=qt, shape=f"{rows}x{cols}", kernel=label, us=t * 1e6, GBs=gbs,
                                        pct=100 * gbs / copy_bw))
                line.append(f"{label} {t * 1e6:6.1f}us {gbs:5.0f} {100 * gbs / copy_bw:3.0f}%")
            print(f"{qt:7s} {rows}x{cols}: " + " | ".join(line), flush=True)
            del copies
        json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "sweep.json"), "w"), indent=1)
    print("mismatches:", bad)


if __name__ == "__main__":
    main()
