"""The CUDA backend's weights on the device (a mixin of CUDABackend, lite/backends/cuda.py): uploaded
from the mapped file through pinned buffers, fusable groups (q/k/v, gate/up) stacked into one buffer
each, [gate; up] rows interleaved, and every tensor in the GPU layout kernels/gpu_layout.py chooses
for it (BackendConfig's iq3_layout, int8_dot_types, reference_kernels, gate_up_interleave)."""
import numpy as np

from lite.backends.cuda_moe import _Weight
from lite.kernels.matvec_epilogue import interleave_rows

PINNED_STAGING_BYTES = 64 << 20


class CUDAWeights:
    FUSE = (("attn_q.weight", "attn_k.weight", "attn_v.weight"), ("ffn_gate.weight", "ffn_up.weight"))

    def plan_fusion(self, names):
        """Record the fusable groups (same quant type and row length, in GGUF blocks) that
        upload_weights stacks into one buffer: a decode step then runs one fused product for q, k and v,
        and one for gate and up, instead of five."""
        have = set(names)
        self._groups = []
        for n in names:
            for group in self.FUSE:
                if n.endswith("." + group[0]):
                    prefix = n[: -len(group[0])]
                    members = [prefix + g for g in group]
                    ts = [self.gguf.tensors[m] for m in members if m in have]
                    if (len(ts) == len(group) and len({t.qtype for t in ts}) == 1
                            and len({t.shape[-1] for t in ts}) == 1 and len(ts[0].shape) == 2
                            and ts[0].type_name not in ("F32", "F16")):
                        self._groups.append(members)

    def upload_weights(self, names, fuse=True):
        """Copy each tensor from the mapped file to the device through two pinned buffers, then
        stack plan_fusion's groups (fuse=False: tensors uploaded after the dense ones, the experts)."""
        import cupyx
        cp = self.cp
        from lite.progress import Progress
        progress = Progress(sum(self.gguf.tensors[n].nbytes for n in names),
                            f"loading weights to GPU {self.device.id}")
        staging = [cupyx.empty_pinned(PINNED_STAGING_BYTES, np.uint8) for _ in range(2)]
        events = [None, None]
        slot = 0
        for n in names:
            t = self.gguf.tensors[n]
            if t.type_name == "F32":
                data = cp.empty(t.shape, np.float32)
            elif t.type_name == "F16" and len(t.shape) <= 2:
                data = cp.empty(t.shape, np.float16)
            else:
                data = cp.empty(t.nbytes, np.uint8)
            dst = data.view(np.uint8).reshape(-1)
            for off in range(0, t.nbytes, PINNED_STAGING_BYTES):
                n_b = min(PINNED_STAGING_BYTES, t.nbytes - off)
                if events[slot] is not None:
                    events[slot].synchronize()         # the copy out of this buffer is done
                np.copyto(staging[slot][:n_b], t.raw[off:off + n_b])
                dst[off:off + n_b].set(staging[slot][:n_b], stream=self.stream)
                events[slot] = self.stream.record()
                slot ^= 1
                progress.update(n_b)
            self.w[n] = _Weight(n, t.type_name, t.shape, data)
        self.stream.synchronize()
        progress.close()
        cp = self.cp
        for members in self._groups if fuse else ():
            ws = [self.w[m] for m in members]
            buf = cp.concatenate([w.data for w in ws])          # rows stacked: one weight
            rows = [w.shape[0] for w in ws]
            interleaved = self._interleave(ws)
            if interleaved:      # gate/up rows alternating: a gated decode CTA reads one contiguous range
                F = rows[0]
                buf = buf.reshape(2 * F, -1)[cp.asarray(interleave_rows(F))].reshape(-1)
                for m in members:                                # only the group is ever used
                    del self.w[m]
            else:
                off = 0
                for w in ws:                                     # members become views of it
                    w.data = buf[off:off + w.data.size]
                    off += w.data.size
            self.fused[tuple(members)] = (_Weight("+".join(members), ws[0].qtype,
                                                  (sum(rows), ws[0].shape[1]), buf), rows, interleaved)
        self._regroup_iq3()

    def _regroup_iq3(self):
        """Each IQ3_XXS matrix in the layout kernels/gpu_layout.py chooses for it (BackendConfig's
        iq3_layout, int8_dot_types, reference_kernels). Rows stay contiguous, so a fused group's
        members are views of its new buffer (nbytes apart); token_embd's rows are looked up."""
        from lite.kernels import gpu_layout
        cfg = self.config
        opts = dict(int8_dot_types=tuple(cfg.int8_dot_types), iq3_layout=cfg.iq3_layout,
                    reference=cfg.reference_kernels)
        in_groups = set()
        for members, (gw, _, interleaved) in self.fused.items():
            in_groups.update(members)
            layout = gpu_layout.gpu_layout(gw.qtype, gw.shape, member_shapes=[
                self.w[m].shape for m in members if m in self.w], **opts)
            if layout == gw.qtype:
                continue
            gw.data, gw.qtype, off = gpu_layout.repack(layout, gw.data, *gw.shape), layout, 0
            for m in members if not interleaved else ():     # (interleaved: the members are gone)
                w = self.w[m]                                # whole bands or groups: a member is a byte range
                size = gpu_layout.nbytes(layout, *w.shape)
                w.data, w.qtype = gw.data[off:off + size], layout
                off += size
        for n, w in self.w.items():
            if n in in_groups:
                continue
            layout = gpu_layout.gpu_layout(w.qtype, w.shape, looked_up=n == "token_embd.weight", **opts)
            if layout != w.qtype:
                w.data, w.qtype = gpu_layout.repack(layout, w.data, *w.shape), layout

    def _interleave(self, ws):
        """Store [gate; up] rows alternating (kernels/matvec_epilogue.interleave_rows), so that a
        gated decode CTA's gate and up rows are neighbours rather than a matrix apart (faster, and
        prefill splits the product by strided views): for the types of the gated decode kernel
        (matvec_cuda's, and IQ3_XXS on its integer-dot structs). BackendConfig.gate_up_interleave."""
        from lite.kernels import gpu_layout
        return (len(ws) == 2 and ws[0].name.endswith("ffn_gate.weight") and self.config.gate_up_interleave
                and gpu_layout.interleaves_gate_up(ws[0].qtype, tuple(self.config.int8_dot_types)))
