"""The CUDA backend's mixture-of-experts ops, a mixin of CUDABackend: a constant number of launches
a layer, no host sync (docs/experts.md); types without a grouped product take a loop over the used
experts. Experts kept off the device (--experts host|mmap) are served from a cache of slots
(cuda_host_experts.py) in rounds through the same grouped kernels.

What it takes of the backend: w, cp, stream, device, config, pdl, and the dense ops matmul,
act_mul, as_array and upload_weights. What the host-expert cache takes of it (its interface): cp, stream,
moe_pairs_max_tokens and moe_plan, moe_products, moe_per_expert, moe_combine below."""
import os

import numpy as np

from lite.backends import experts as ex
from lite.backends.cuda_host_experts import HostExperts
from lite.kernels import dequantize, moe_layer as mk, moe_products as mp

FUSED_MAX_TOKENS = 8      # up to this many tokens a product is a fused matvec, not dequant + GEMM


class _Weight:
    __slots__ = ("name", "qtype", "shape", "data")

    def __init__(self, name, qtype, shape, data):
        self.name, self.qtype, self.shape, self.data = name, qtype, shape, data


def expert_bytes(w):
    """Bytes of one expert of a 3-D expert tensor (device-resident or streamed)."""
    eb = getattr(w, "ebytes", None)
    return eb if eb is not None else w.data.size // w.shape[0]


class CUDAExperts:
    # T <= FUSED_MAX_TOKENS: one fused launch over (token, expert) pairs for gate and up, one for
    # down. Up to MOE_FUSED_MAX_TOKENS: the products over expert-sorted blocks of 8 tokens.
    # Beyond: the used experts dequantized to fp16 in one launch a tensor, cublasGemmBatchedEx over
    # blocks of bm tokens of one expert (device pointer arrays). Padding rows and blocks are
    # computed but never read; the combine gathers each token's k rows in slot order.
    MOE_FUSED_MAX_TOKENS = 64
    host_experts = None           # a cuda_host_experts.HostExperts when experts live off the device

    supports_host_experts = True
    moe_pairs_max_tokens = FUSED_MAX_TOKENS   # the host experts' decode: the products over pairs
    # moe_experts(residual=) adds the residual inside the combine (the same fp32 add as after it):
    # one launch a layer fewer in decode (models/qwen3moe.py asks for it where this is set)
    moe_residual = True

    def place_experts(self, gguf, names, experts="auto", expert_cache="auto", n_slots=None, dev_slots=None):
        """Put a stage's expert tensors where --experts says; called after the dense weights and
        the KV cache are allocated, so auto sees the VRAM that is left. -> lite.backends.experts.Residency.
        n_slots overrides the host-managed cache's size in slots (tests: a cache of one expert),
        dev_slots the device cache's (decode; cuda_expert_dev.py)."""
        cp = self.cp
        with self.device:
            free_vram = cp.cuda.runtime.memGetInfo()[0] + cp.get_default_memory_pool().free_bytes()
        total = sum(gguf.tensors[n].nbytes for n in names)
        layers = {}
        for n in names:
            t = gguf.tensors[n]
            layers[n.split(".")[1]] = layers.get(n.split(".")[1], 0) + t.nbytes
        slot = max(sum(gguf.tensors[n].nbytes // gguf.tensors[n].shape[0] for n in names
                       if n.split(".")[1] == il) for il in layers)
        free_host = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        r = ex.resolve(experts, expert_cache, total, free_vram, free_host, slot, max(layers.values()))
        if r.mode == "gpu":
            self.upload_weights(names, fuse=False)    # the dense fusion groups are done
            return r
        with self.device:
            c = self.config
            self.host_experts = HostExperts(self, gguf, names, r.mode, r.cache_bytes,
                                            retain=ex.parse_cache(expert_cache) != 0, n_slots=n_slots,
                                            dev_slots=dev_slots, prefetch=c.expert_prefetch,
                                            device_cache=c.expert_device_cache,
                                            prefill_share=c.expert_prefill_share,
                                            full_layer=c.expert_full_layer)
        return r

    def expert_stats(self):
        """The expert cache's counters, or None when the experts are on the device."""
        return None if self.host_experts is None else self.host_experts.stats()

    def moe_graph_safe(self):
        """Can a decode step of this MoE stage be captured in a CUDA graph? Yes when the grouped
        path serves it without cuBLAS or a host sync: every expert tensor in a type the grouped
        products take (kernels/moe_products.py TYPES; else the per-expert loop reads ids on the host), either
        resident on the device or served at decode by a device-managed expert cache (--experts
        host, cuda_expert_dev.py: bookkeeping and copies on the device), and no shared expert
        (qwen2moe's sigmoid gate is a CuPy dot, i.e. cuBLAS, which capture refuses), or one whose
        gate is the sigmoid_gate_add kernel (BackendConfig.hybrid_graphs, an F32 gate vector)."""
        shared = [w for n, w in self.w.items() if n.endswith("ffn_gate_inp_shexp.weight")]
        if shared and not (self.config.hybrid_graphs and all(w.qtype == "F32" for w in shared)):
            return False
        hx = self.host_experts
        if hx is not None:
            if not hx.graph_safe():
                return False
            return all(mp.fits(w.qtype, b.data.ptr, w.ebytes)
                       for p in hx.pools for ws in [hx.weights[il] for il in hx.pool_of if hx.pool_of[il] is p]
                       for w, b in zip(ws, p.dev.bufs))
        exps = [w for n, w in self.w.items() if n.endswith("_exps.weight")]
        return all(mp.fits(w.qtype, w.data.data.ptr, expert_bytes(w)) for w in exps)

    def moe_graph_rows(self):
        """The most rows of a step of this MoE stage whose launches can all be captured (lite/engine/paged_cuda.py
        max_rows), where moe_graph_safe holds: the router's kernel and the experts' sorted products take up
        to MOE_FUSED_MAX_TOKENS, within what the dense products take (graph_rows), with BackendConfig.batched_mma
        (off until its GPU tests pass); experts off the device only their decode (past it the host reads the
        routed ids)."""
        if self.host_experts is not None or not self.config.batched_mma:
            return FUSED_MAX_TOKENS
        return min(self.router_kernel_rows(), self.graph_rows())

    def router_kernel_rows(self):
        """Up to how many rows the router's logits are moe_logits (no cuBLAS: capturable): decode's, or
        with BackendConfig.batched_mma every row count moe_graph_rows may give."""
        return self.MOE_FUSED_MAX_TOKENS if self.config.batched_mma else FUSED_MAX_TOKENS

    def add_sigmoid_gated(self, base, x, h, name):
        """base + x scaled row by row by sigmoid(h . w) (the shared expert's gate, w an F32 vector):
        one kernel with BackendConfig.hybrid_graphs (capturable), else CuPy ops and cuBLAS."""
        w = self.w[name]
        if not (self.config.hybrid_graphs and w.qtype == "F32"):
            return self.add(base, self.sigmoid_gate(x, h, name))
        from lite.kernels import delta_rule
        return delta_rule.sigmoid_gate_add(self.as_array(base), self.as_array(x), self.as_array(h),
                                           w.data, self.stream)

    def moe_route(self, h, name, k, normalize):
        """Softmax router, top-k, renormalized, on the device -> ids (T, k) int32, weights (T, k) f32."""
        cp = self.cp
        w = self.w[name].data                                 # (n_expert, n_embd) f32
        T = h.shape[0]
        with self.stream:
            h = cp.ascontiguousarray(h, dtype=np.float32)
            if T <= self.router_kernel_rows():
                lg = cp.empty((T, w.shape[0]), np.float32)
                mk.logits(h, w, lg, pdl=self.pdl)
            else:
                lg = cp.ascontiguousarray(h @ w.T)
            ids = cp.empty((T, k), np.int32)
            wts = cp.empty((T, k), np.float32)
            mk.topk(lg, k, normalize, ids, wts, pdl=self.pdl)
        return ids, wts

    def moe_experts(self, h, il, ids, weights, act, residual=None):
        """Sum over each token's chosen experts of weight * down(act(gate(h)) * up(h)), plus
        residual when given (inside the combine on the grouped path: the same fp32 sum)."""
        out = self._moe_experts(h, il, ids, weights, act, residual)
        if isinstance(out, tuple):                             # the residual is not in it yet
            out = out[0]
            return out if residual is None else self.as_array(residual) + out
        return out

    def _moe_experts(self, h, il, ids, weights, act, residual):
        """moe_experts' paths: an array with the residual in it, or (array,) without."""
        cp = self.cp
        if act not in ("silu", "gelu_tanh"):
            raise ValueError(f"unknown activation {act!r}")
        hx = self.host_experts
        if hx is not None and hx.serves(il):
            with self.stream:
                return (hx.moe_experts(self, h, il, ids, weights, act),)
        ws = [self.w[f"blk.{il}.ffn_{n}_exps.weight"] for n in ("gate", "up", "down")]
        with self.stream:
            h = cp.ascontiguousarray(h, dtype=np.float32)
            ids = cp.ascontiguousarray(cp.asarray(ids), dtype=np.int32)   # CPU-made int64 ids too
            weights = cp.ascontiguousarray(cp.asarray(weights), dtype=np.float32)
            plan = self.moe_plan(ids, ws)
            if plan is None:
                return (self.moe_per_expert(h, il, ids, weights, act),)
            y = self.moe_products(plan, h, ids, ws, act)
            res = None if residual is None else cp.ascontiguousarray(self.as_array(residual))
            return self.moe_combine(y, plan.get("pos"), weights, res)

    def moe_combine(self, y, pos, weights, residual=None):
        """out (T, n_embd) = sum over j of weights[t, j] * y[pos[t * k + j]] (pos None: row t * k + j),
        plus residual (T, n_embd) when given, on the stream."""
        with self.stream:
            out = self.cp.empty((weights.shape[0], y.shape[1]), np.float32)
            mk.combine(y, pos, weights, out, residual, pdl=self.pdl)
        return out

    def moe_plan(self, ids, ws, bm=None, bases=None):
        """Which path, and the device index arrays it needs (moe_align's; none for pairs). bases:
        the slot buffers the experts will come from (their alignment decides as the tensors')."""
        cp = self.cp
        T, k = ids.shape
        n_expert = ws[0].shape[0]
        src = bases or [w.data for w in ws]
        fused = all(mp.fits(w.qtype, b.data.ptr, expert_bytes(w)) for w, b in zip(ws, src))
        if fused and T <= FUSED_MAX_TOKENS:
            return {"path": "pairs", "n": 1, "blk_expert": ids.reshape(-1), "blk_rows": None,
                    "n_blocks": T * k, "pos": None}
        if T <= FUSED_MAX_TOKENS and bases is None:
            return None                      # no fused kernel for this type: per expert (syncs)
        S = T * k
        if fused and T <= self.MOE_FUSED_MAX_TOKENS:
            path, bm = "sorted", mp.SORTED_BLOCK
        else:
            path = "gemm"
            # blocks of bm rows: unused and padding rows cost up to n_expert * bm rows of work
            bm = bm or max([16] + [b for b in (32, 64, 128) if n_expert * b <= S // 2])
        nbm = mk.max_blocks(S, n_expert, bm)
        plan = {"path": path, "n": bm, "bm": bm, "n_blocks": nbm,
                "blk_expert": cp.empty(nbm, np.int32), "blk_rows": cp.empty(nbm * bm, np.int32),
                "pos": cp.empty(S, np.int32), "used_list": cp.empty(n_expert, np.int32),
                "rank": cp.empty(n_expert, np.int32), "meta": cp.empty(2, np.int32)}
        mk.align(ids, n_expert, bm, plan, pdl=self.pdl)
        return plan

    def moe_products(self, plan, h, ids, ws, act, bases=None, slot_of=None, y=None, rnd=None):
        """The experts' rows y (padded order) for a plan. bases (3 device uint8 buffers) and slot_of
        (expert -> slot, -1 = skip) serve experts from a cache's slots instead of the layer tensors;
        rows of skipped experts are left as they are in y, so rounds can fill one y in turn. rnd
        (the cache's Round, host side) is needed for types without a gathered dequantize."""
        cp = self.cp
        wg, wu, wd = ws
        src = bases or [w.data for w in ws]
        n_expert, ff, n_embd = wg.shape
        P = plan["n_blocks"] * plan["n"]
        if y is None:
            y = cp.empty((P, n_embd), np.float32)
        if plan["path"] == "gemm":
            return self._moe_gemm(plan, h, ws, src, act, slot_of, y, rnd)
        S = ids.size
        T, k = ids.shape
        kw = dict(slot_of=slot_of, blk_expert=plan["blk_expert"], blk_rows=plan["blk_rows"], kdiv=k, S=S,
                  n_blocks=plan["n_blocks"], pdl=self.pdl)
        int8 = self.moe_int8_types()
        a = cp.empty((P, ff), np.float32)
        steps = {}                           # what _trace keeps besides a and y
        if plan["n"] == 1 and wg.qtype == wu.qtype and self.config.moe_gated:
            # gate, up and the activation in one launch (the decode product's gated form)
            mp.decode(wg.qtype, src[0], src[1], expert_bytes(wg), x=h, out0=a, out1=None, rows=ff,
                       cols=n_embd, act=act, int8=wg.qtype in int8, **kw)
        else:
            gu = steps["gu"] = cp.empty((2, P, ff), np.float32)
            if wg.qtype == wu.qtype:
                mp.grouped(wg.qtype, plan["n"], src[0], src[1], expert_bytes(wg), x=h, out0=gu[0],
                              out1=gu[1], rows=ff, cols=n_embd, int8=wg.qtype in int8, **kw)
            else:
                for i, w in ((0, wg), (1, wu)):
                    mp.grouped(w.qtype, plan["n"], src[i], None, expert_bytes(w), x=h, out0=gu[i],
                                  out1=None, rows=ff, cols=n_embd, int8=w.qtype in int8, **kw)
            mk.act(gu[0], gu[1], a, act, pdl=self.pdl)
        mp.grouped(wd.qtype, plan["n"], src[2], None, expert_bytes(wd), x=a, out0=y, out1=None,
                      rows=n_embd, cols=ff, x_by_row=True, int8=wd.qtype in int8, **kw)
        self._trace(a=a, y=y, **steps)
        return y

    def moe_int8_types(self):
        """The expert types whose decode products run over x quantized to int8 (BackendConfig:
        moe_int8_dot for the int8_dot_types)."""
        return tuple(self.config.int8_dot_types) if self.config.moe_int8_dot else ()

    # Set to a dict to keep each step's device arrays of the next moe_products (to check them one by
    # one against NumPy and find the first step that differs); None: nothing kept.
    moe_trace = None

    def _trace(self, **arrays):
        if self.moe_trace is not None:
            self.moe_trace.update(arrays)

    def _moe_gemm(self, plan, h, ws, src, act, slot_of, y, rnd=None):
        """Used experts dequantized to fp16 (one launch a tensor), two cublasGemmBatchedEx calls.
        Every round runs the same batch (all nb_max blocks; blocks not live this round write into
        a dummy), so cuBLAS picks the same algorithm and a row's result does not depend on the
        rounds: outputs are byte-identical whatever the expert cache size."""
        cp = self.cp
        wg, wu, wd = ws
        n_expert, ff, n_embd = wg.shape
        bm, nbm = plan["bm"], plan["n_blocks"]
        P = nbm * bm
        S = plan["pos"].size
        eelems = ff * n_embd
        ref = self.config.reference_kernels
        kerns = [mk.gather_dequant_kernel(w.qtype, ref) for w in ws]
        gathered = all(kr is not None for kr in kerns)
        rank = plan["rank"]
        if gathered:
            n_deq = min(n_expert, S)          # compact: used expert j -> row j (rank)
        elif slot_of is None:
            n_deq = n_expert                  # whole tensor: row = expert index (rank None)
            rank = None
        else:                                 # slots: this round's experts, one launch each
            n_deq = len(rnd.experts)
            rank = cp.asarray(np.array([rnd.experts.index(e) if e in rnd.experts else -1
                                        for e in range(n_expert)], np.int32))
        wa = cp.empty((n_deq, eelems), np.float16)            # gate, then down (stream order)
        wb = cp.empty((n_deq, eelems), np.float16)            # up

        def deq(i, out):
            eb = expert_bytes(ws[i])
            if gathered:
                mk.gather_dequant(kerns[i], src[i], eb, eelems, plan["used_list"], slot_of, out, n_deq)
            elif slot_of is None:
                dequantize(src[i], ws[i].qtype, np.float16, self.stream, out=out.reshape(-1), reference=ref)
            else:
                for j, s_ in enumerate(rnd.slots):
                    dequantize(src[i][s_ * eb:(s_ + 1) * eb], ws[i].qtype, np.float16, self.stream, out=out[j],
                               reference=ref)

        xs = cp.empty((P, n_embd), np.float16)                # (P, n_embd) rows in padded order
        mk.gather_rows_f16(h, plan["blk_rows"], xs, pdl=self.pdl)
        gu = cp.empty((2, P, ff), np.float32)
        h16 = cp.empty((P, ff), np.float16)
        dummy = cp.empty((bm, n_embd), np.float32)
        arrays = cp.empty((9, nbm), np.uint64)
        deq(0, wa)
        deq(1, wb)
        mk.gemm_pointers(plan["blk_expert"], rank, slot_of, nbm,
                wa.data.ptr, wb.data.ptr, wa.data.ptr, eelems * 2, xs.data.ptr, bm * n_embd * 2,
                gu[0].data.ptr, gu[1].data.ptr, bm * ff * 4, h16.data.ptr, bm * ff * 2,
                y.data.ptr, bm * n_embd * 4, dummy.data.ptr, arrays, pdl=self.pdl)
        handle = cp.cuda.device.get_cublas_handle()
        from cupy_backends.cuda.libs import cublas
        cublas.setStream(handle, self.stream.ptr)
        # Row-major Y = X W^T as column-major Y^T = W X^T (as gemm_f16_f32), per block.
        mk.gemm_batched_f16(handle, ff, bm, n_embd, arrays[0].data.ptr, n_embd, arrays[2].data.ptr, n_embd,
                            arrays[4].data.ptr, ff, 2 * nbm)
        mk.act(gu[0], gu[1], h16, act, pdl=self.pdl)
        deq(2, wa)
        mk.gemm_batched_f16(handle, n_embd, bm, ff, arrays[6].data.ptr, ff, arrays[7].data.ptr, ff,
                            arrays[8].data.ptr, n_embd, nbm)
        self._trace(wd16=wa, wu16=wb, xs=xs, gu=gu, h16=h16, y=y, arrays=arrays)
        return y

    def moe_per_expert(self, h, il, ids, weights, act, weight_of=None, ids_h=None, y=None, experts=None,
                       combine=True):
        """Expert by expert, for few tokens of a type with no grouped product (kernels/moe_products.py
        TYPES; other IQ and K types, or misaligned data): the host reads the ids (a sync) and
        launches per used expert. Each token-slot's row goes to y (slot order, as the pairs path),
        then one combine: so streamed experts (weight_of: expert, kind -> a weight in a cache slot;
        experts: this round's) give the same bytes in rounds."""
        cp = self.cp
        h = cp.ascontiguousarray(h, dtype=np.float32)
        ids_h = cp.asnumpy(ids) if ids_h is None else ids_h
        T, k = ids_h.shape
        if y is None:
            y = cp.empty((T * k, h.shape[1]), np.float32)
        if weight_of is None:
            weight_of = lambda e, kind: self._expert_weight(f"blk.{il}.ffn_{kind}_exps.weight", e)  # noqa: E731
        for e in (np.unique(ids_h) if experts is None else experts):
            rows, slot = np.nonzero(ids_h == e)
            if rows.size == 0:
                continue
            x = h[cp.asarray(rows)]
            g = self.matmul(x, weight_of(e, "gate"))
            u = self.matmul(x, weight_of(e, "up"))
            y[cp.asarray(rows * k + slot)] = self.matmul(self.act_mul(g, u, act), weight_of(e, "down"))
        if not combine:
            return y
        return self.moe_combine(y, None, cp.ascontiguousarray(cp.asarray(weights), dtype=np.float32))

    def _expert_weight(self, name, e):
        w = self.w[name]
        n_exp, rows, cols = w.shape
        if w.data.ndim == 3:                  # F32 experts: a float32 (n_exp, rows, cols) array
            return _Weight(name, w.qtype, (rows, cols), w.data[e])
        per = w.data.size // n_exp
        data = w.data[e * per:(e + 1) * per]
        if w.qtype == "F16":                  # matmul multiplies F16 as the float16 matrix it is
            data = data.view(np.float16).reshape(rows, cols)
        return _Weight(name, w.qtype, (rows, cols), data)
