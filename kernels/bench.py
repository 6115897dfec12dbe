"""Kernel benchmark: dequantize and fused matvec bandwidth per quant type, beside device copy;
the chunked delta rule's kernels (`python3 -m lite.kernels.bench --delta-rule 8192`) and the flash
prefill attention's (`--flash-attn 8192`: ms and TFLOP/s at head dims 128 and 256).

    rows = bench_kernels(["Q4_K", "Q6_K"])
    print(format_table(rows))

Every figure is timed inside captured CUDA graphs (many launches per graph), because a single
Python-side launch costs 7-200 us of host time, more than the kernels themselves take at these
sizes (shared device notes). Bandwidths:
  dequant: (bytes of blocks read + bytes of fp16 written) / time
  matvec:  bytes of weight blocks / time (x and out are negligible), one activation row; the
           launches of a graph rotate through copies of the weights (> L2_ROTATE_BYTES in all),
           so that the 50 MB L2 of an H100/H200 cannot serve them as it would a 9 MB matrix
  copy:    (bytes read + bytes written) / time of copying 1 GiB, same run: cudaMemcpyAsync device
           to device, a CuPy elementwise copy, and a copy kernel of 16-byte loads and stores
           (copy-vec16: the first two fall short of what a kernel can move); every % of copy is
           against the fastest
A GPU layout of a GGUF type (registry.GPU_LAYOUTS: IQ3_XXS_G4 stores 4% more bytes than IQ3_XXS)
counts its GGUF type's bytes: the bandwidth of the weights the file holds.
"""
import itertools
import logging
import statistics

import numpy as np

from lite.kernels.cuda_source import source
from lite.kernels.matvec_cuda import INT8_DOT_TYPES
from lite.kernels.registry import dequant_types, get_dequant, get_matvec, gguf_type, quant_info

log = logging.getLogger(__name__)

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336), (768, 2048))
REPEATS = 5
L2_ROTATE_BYTES = 256 << 20
MAX_LAUNCHES = 200


def _time_graph(enqueue, stream, launches):
    """Median seconds of one `enqueue()` over REPEATS timings of a graph holding `launches` calls."""
    import cupy
    enqueue()                                   # compile / warm caches outside the capture
    stream.synchronize()
    with stream:
        stream.begin_capture()
        for _ in range(launches):
            enqueue()
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    times = []
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(REPEATS):
        start.record(stream)
        graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3 / launches)
    return statistics.median(times)


def copy_bandwidth(stream, nbytes=1 << 30, elementwise=False):
    """Device copy GB/s (read + write) of an nbytes buffer: cudaMemcpyAsync device to device
    (the ceiling), or with elementwise=True a CuPy elementwise copy kernel (what a plain kernel gets)."""
    import cupy
    with stream:
        src = cupy.ones(nbytes // 4, dtype=np.float32)
        dst = cupy.empty_like(src)
    if elementwise:
        t = _time_graph(lambda: cupy.copyto(dst, src), stream, 10)
    else:
        t = _time_graph(lambda: dst.data.copy_from_device_async(src.data, nbytes, stream), stream, 10)
    return 2 * nbytes / t / 1e9


C_COPY16 = source("copy16.cu")


def copy16_bandwidth(stream, nbytes=1 << 30):
    """GB/s (read + write) of C_COPY16 over an nbytes buffer (a multiple of 16)."""
    import cupy
    kern = cupy.RawKernel(C_COPY16, "copy16")
    with stream:
        src = cupy.ones(nbytes // 4, dtype=np.float32)
        dst = cupy.empty_like(src)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    n = np.int64(nbytes // 16)
    t = _time_graph(lambda: kern((sms * 8,), (256,), (src, dst, n), stream=stream), stream, 10)
    return 2 * nbytes / t / 1e9


GRAPH_SECONDS = 0.005          # what a timed graph should run for at DEVICE_BYTES_PER_S
DEVICE_BYTES_PER_S = 4e12      # about an H100 / H200's copy bandwidth


def _launches_for(nbytes):
    """Enough launches of a kernel moving nbytes that a graph runs for several milliseconds (up to
    MAX_LAUNCHES), so that the graph's own start and the first launch's lone start weigh little in the
    per-launch time (too few launches a graph put its overhead, ~0.4 us, on each)."""
    return int(min(MAX_LAUNCHES, max(10, DEVICE_BYTES_PER_S * GRAPH_SECONDS / max(nbytes, 1))))


def _rotation(blocks, stream):
    """`blocks` and enough device copies of it that one pass over them all overflows the L2."""
    import cupy
    copies = min(MAX_LAUNCHES, -(-L2_ROTATE_BYTES // max(blocks.nbytes, 1)))
    with stream:
        return [blocks] + [cupy.array(blocks) for _ in range(copies - 1)]


def _dequant_impls(qtype):
    """(label, launch(blocks, out, stream)) for each implementation of a type's dequantize."""
    _, launch = get_dequant(qtype)
    impls = [("dequant", launch)]
    if hasattr(launch, "launch"):             # dequant_basic/dequant_k kernels have two
        impls = [("dequant", lambda b, o, s: launch(b, o, s)),
                 ("dequant-numba", lambda b, o, s: launch(b, o, s, reference=True))]
    return impls


def default_types():
    """Every type with a dequantize kernel, and the GPU layouts with only a matvec (IQ3_XXS_B16)."""
    from lite.kernels.registry import matvec_types
    return sorted(set(dequant_types()) | set(matvec_types()))


def bench_kernels(types=None, shapes=None, numba_variants=True, pdl=None, int8_dot_types=INT8_DOT_TYPES):
    """One dict per (type, shape, kernel): type, shape, kernel, us, gbps, pct_copy; plus a row
    kernel="copy" with the device copy bandwidth used for pct_copy. pdl and int8_dot_types as the
    backend's (BackendConfig; pdl None: where the GPU has it)."""
    import cupy

    from lite.kernels import pdl as pdl_mod
    pdl = pdl_mod.resolve(pdl)
    stream = cupy.cuda.Stream(non_blocking=True)
    copies = {"copy": copy_bandwidth(stream), "copy-elementwise": copy_bandwidth(stream, elementwise=True)}
    try:
        copies["copy-vec16"] = copy16_bandwidth(stream)
    except Exception as e:  # noqa: BLE001 - the other two copies still give a reference
        log.warning("copy-vec16 failed: %s", e)
    copy = max(copies.values())
    rows = [{"type": "-", "shape": "1 GiB", "kernel": k, "us": None, "gbps": g, "pct_copy": 100 * g / copy}
            for k, g in copies.items()]
    types = [quant_info(t).name for t in (types or default_types())]
    rng = cupy.random.default_rng(0)
    for qtype in types:
        info = quant_info(qtype)
        for r, c in (shapes or SHAPES):
            n = r * c
            if c % info.block_elems:
                continue
            nb = n // info.block_elems * info.type_size
            # a GPU layout (registry.GPU_LAYOUTS, e.g. IQ3_XXS_G4's 4% more bytes): its GGUF type's bytes count
            counted = n // info.block_elems * quant_info(gguf_type(qtype)).type_size
            with stream:
                blocks = rng.integers(0, 256, nb, dtype=np.uint8)
                if info.block_elems == 1:          # float types: finite values (f16 1.0 pattern)
                    blocks = cupy.tile(cupy.array([0, 0x3C], dtype=np.uint8), nb // 2)
                out = cupy.empty(n, dtype=np.float16)
            shape = f"{r}x{c}"
            impls = _dequant_impls(qtype) if info.name in dequant_types() else []
            if info.name not in dequant_types():   # a layout whose dequantize needs the shape (IQ3_XXS_B16)
                from lite.kernels import gpu_layout
                impls = [("dequant", lambda b, o, s, q=info.name, r=r, c=c:
                          gpu_layout.dequantize_matrix(b, q, r, c, np.float16, s, out=o))]
            for label, launch in impls:
                if label.endswith("numba") and not numba_variants:
                    continue
                try:
                    t = _time_graph(lambda b=blocks, o=out: launch(b, o, stream), stream,
                                  _launches_for(nb + 2 * n))
                except Exception as e:  # noqa: BLE001 - one broken kernel must not hide the others
                    log.warning("%s %s %s failed: %s", qtype, shape, label, e)
                    continue
                g = (counted + 2 * n) / t / 1e9
                rows.append({"type": qtype, "shape": shape, "kernel": label, "us": t * 1e6,
                             "gbps": g, "pct_copy": 100 * g / copy})
            matvec = get_matvec(qtype)
            if matvec is not None:
                with stream:
                    x = cupy.ones((1, c), dtype=np.float32)
                    y = cupy.empty((1, r), dtype=np.float32)
                    rot = _rotation(blocks, stream)
                weights = itertools.cycle(rot)       # each captured launch reads the next copy
                try:
                    t = _time_graph(lambda: matvec(next(weights), x, y, r, c, stream, pdl=pdl,
                                                   int8_dot_types=int8_dot_types), stream,
                                    max(len(rot), _launches_for(nb)))
                except Exception as e:  # noqa: BLE001
                    log.warning("%s %s matvec failed: %s", qtype, shape, e)
                    continue
                g = counted / t / 1e9
                rows.append({"type": qtype, "shape": shape, "kernel": "matvec", "us": t * 1e6,
                             "gbps": g, "pct_copy": 100 * g / copy})
                del rot, weights
            del blocks, out
    return rows


def delta_rule_timings(T=8192, Hk=16, Hv=32, dk=128, dv=128):
    """Milliseconds (median of REPEATS, after a warm-up call) of one chunked delta rule over T
    tokens at qwen3next-80B's shape: the fp32 CUDA-core kernel and the tensor-core one (tf32,
    3xtf32), each on its own copy of one state. Events around plain calls: the wrappers allocate."""
    import cupy
    from lite.kernels import delta_rule, delta_rule_mma
    rng = np.random.default_rng(0)
    unit = lambda x: x / cupy.linalg.norm(x, axis=-1, keepdims=True)   # noqa: E731
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        q = unit(cupy.asarray(rng.standard_normal((T, Hk, dk)), np.float32))
        k = unit(cupy.asarray(rng.standard_normal((T, Hk, dk)), np.float32))
        v = cupy.asarray(rng.standard_normal((T, Hv, dv)), np.float32)
        g = cupy.asarray(-rng.exponential(0.1, (T, Hv)), np.float32)
        beta = cupy.asarray(rng.uniform(0, 1, (T, Hv)), np.float32)
        S0 = cupy.asarray(rng.standard_normal((Hv, dk, dv)), np.float32)
    kernels = {"fp32 (delta_rule.chunked)": delta_rule.chunked,
               "tf32 (delta_rule_mma)": delta_rule_mma.chunked,
               "3xtf32 (delta_rule_mma)": lambda *a: delta_rule_mma.chunked(*a, split=True)}
    rows = []
    for label, fn in kernels.items():
        S = S0.copy()
        fn(q, k, v, g, beta, S, dk ** -0.5, stream)
        start, stop, times = cupy.cuda.Event(), cupy.cuda.Event(), []
        for _ in range(REPEATS):
            start.record(stream)
            fn(q, k, v, g, beta, S, dk ** -0.5, stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop))
        rows.append((label, statistics.median(times)))
    return rows


# (label, head dim, query heads, KV heads): the 8B's attention and qwen3next-80B's gated attention
FLASH_SHAPES = (("8B", 128, 32, 8), ("qwen3next-80B", 256, 16, 2))


def flash_timings(T=8192):
    """(label, ms, TFLOP/s) of one causal prefill of T tokens from position 0 through
    kernels/flash_attention.py at FLASH_SHAPES (median of REPEATS after a warm-up call); FLOPs are
    the two products over the unmasked query-key pairs, 4 D H T (T + 1) / 2."""
    import cupy
    from lite.kernels.flash_attention import flash_prefill
    rng = np.random.default_rng(0)
    stream = cupy.cuda.Stream(non_blocking=True)
    rows = []
    for label, D, H, Hkv in FLASH_SHAPES:
        with stream:
            q = cupy.asarray(rng.standard_normal((T, H, D)), np.float32)
            K = cupy.asarray(rng.standard_normal((Hkv, T, D)) * 0.5, np.float16)
            V = cupy.asarray(rng.standard_normal((Hkv, T, D)), np.float16)
        run = lambda: flash_prefill(q, K, V, 0, 0, D ** -0.5, stream)   # noqa: E731
        run()
        start, stop, times = cupy.cuda.Event(), cupy.cuda.Event(), []
        for _ in range(REPEATS):
            start.record(stream)
            run()
            stop.record(stream)
            stop.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, stop))
        ms = statistics.median(times)
        rows.append((f"{label} (D={D}, {H}/{Hkv} heads)", ms, 4 * D * H * T * (T + 1) / 2 / ms / 1e9))
    return rows


def format_table(rows):
    """Markdown table of bench_kernels() rows."""
    lines = ["| type | shape | kernel | us | GB/s | % of copy |", "| --- | --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        us = "" if r["us"] is None else f"{r['us']:.1f}"
        lines.append(f"| {r['type']} | {r['shape']} | {r['kernel']} | {us} | {r['gbps']:,.0f} | {r['pct_copy']:.0f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    import json
    p = argparse.ArgumentParser(description="lite kernel benchmark")
    p.add_argument("types", nargs="*")
    p.add_argument("--json")
    p.add_argument("--no-numba", action="store_true")
    p.add_argument("--delta-rule", type=int, metavar="T",
                   help="time the chunked delta rule over T tokens (qwen3next-80B's heads) instead")
    p.add_argument("--flash-attn", type=int, metavar="T",
                   help="time the flash prefill attention over T tokens (the 8B's and qwen3next-80B's heads) instead")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO)
    if a.flash_attn:
        for label, ms, tflops in flash_timings(a.flash_attn):
            print(f"flash attention T={a.flash_attn}: {label}: {ms:.3f} ms, {tflops:.1f} TFLOP/s")  # noqa: T201
        raise SystemExit(0)
    if a.delta_rule:
        for label, ms in delta_rule_timings(a.delta_rule):
            print(f"delta rule T={a.delta_rule}: {label}: {ms:.3f} ms")  # noqa: T201 - command-line entry point
        raise SystemExit(0)
    result = bench_kernels(a.types or None, numba_variants=not a.no_numba)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    print(format_table(result))  # noqa: T201 - command-line entry point
