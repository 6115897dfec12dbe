"""KV cache: preallocated per stage for its layers up to max_context.

kind "f32" | "f16" | "int8"; int8 keeps one float32 scale per token and head (symmetric, max-abs).
Written through the array module of the backend (numpy or cupy), so one class serves both.
A hybrid model's recurrent layers have no KV cache: their state is a RecurrentState (below),
which the KVCache of the stage holds beside the attention layers' cache, so that the stage owns
both.
"""
import contextlib

import numpy as np

from lite.errors import ContextOverflowError

KV_KINDS = ("f16", "int8", "f32")


def kv_bytes_per_token(cfg, n_layers, kind):
    per_val = {"f32": 4, "f16": 2, "int8": 1}[kind]
    b = n_layers * cfg.n_head_kv * (cfg.head_dim + cfg.v_head_dim) * per_val
    if kind == "int8":
        b += n_layers * cfg.n_head_kv * 2 * 4
    return b


class KVCache:
    def __init__(self, cfg, layers, max_context, kind="f16", xp=np):
        if kind not in KV_KINDS:
            raise ValueError(f"kv cache type must be one of {', '.join(KV_KINDS)}, got {kind!r}")
        self.kind, self.max_context, self.xp = kind, int(max_context), xp
        dtype = {"f32": np.float32, "f16": np.float16, "int8": np.int8}[kind]
        H, S = cfg.n_head_kv, self.max_context
        self.recurrent = RecurrentState(cfg, [il for il in layers if cfg.is_recurrent_layer(il)], xp)
        layers = [il for il in layers if not cfg.is_recurrent_layer(il)]
        self.k = {il: xp.zeros((H, S, cfg.head_dim), dtype) for il in layers}       # (Hkv, S, D)
        self.v = {il: xp.zeros((H, S, cfg.v_head_dim), dtype) for il in layers}     # (Hkv, S, Dv)
        if kind == "int8":
            self.ks = {il: xp.zeros((H, S), np.float32) for il in layers}           # (Hkv, S)
            self.vs = {il: xp.zeros((H, S), np.float32) for il in layers}

    def check_fits(self, n_tokens):
        if n_tokens > self.max_context:
            raise ContextOverflowError(
                f"{n_tokens} tokens do not fit the context of {self.max_context} "
                f"(raise --max-context, or shorten the prompt or -n)")

    def _quantize(self, x):                     # x (T, H, D) f32 -> int8 (H, T, D), scales (H, T)
        xp = self.xp
        amax = xp.abs(x).max(axis=-1)
        scale = (amax / 127.0).astype(np.float32)
        safe = xp.where(scale > 0, scale, np.float32(1.0))
        q = xp.clip(xp.rint(x / safe[..., None]), -127, 127).astype(np.int8)
        return q.transpose(1, 0, 2), scale.T

    def write(self, il, k, v, pos0):
        """k (T, Hkv, D), v (T, Hkv, Dv) float32 at positions pos0..pos0+T-1."""
        T = k.shape[0]
        self.check_fits(pos0 + T)
        if self.kind == "int8":
            qk, sk = self._quantize(k)
            qv, sv = self._quantize(v)
            self.k[il][:, pos0:pos0 + T] = qk
            self.v[il][:, pos0:pos0 + T] = qv
            self.ks[il][:, pos0:pos0 + T] = sk
            self.vs[il][:, pos0:pos0 + T] = sv
        else:
            self.k[il][:, pos0:pos0 + T] = k.transpose(1, 0, 2)
            self.v[il][:, pos0:pos0 + T] = v.transpose(1, 0, 2)

    def read(self, il, n):
        """The first n positions as float32: (Hkv, n, D), (Hkv, n, Dv)."""
        k, v = self.k[il][:, :n], self.v[il][:, :n]
        if self.kind == "int8":
            return (k.astype(np.float32) * self.ks[il][:, :n, None],
                    v.astype(np.float32) * self.vs[il][:, :n, None])
        return k.astype(np.float32), v.astype(np.float32)


class RecurrentState:
    """Per recurrent layer of a stage, for one sequence: the conv window (the last taps-1 rows of
    the pre-conv q|k|v, zero at the start) and the delta-rule matrix S (Hv, dk, dv), both float32.
    A chunk updates them in place; unlike a KV cache they cannot be rewound. Each layer tracks the
    position it has reached: a chunk at 0 clears the layer, a chunk elsewhere than that position
    (a calibration's timing run) leaves the state unknown (-1) until the next chunk at 0, so that
    the engine never reuses it (Engine.prefill asks at()).

    Since the state cannot go back, prefix reuse restores checkpoints: copies of every layer's
    state taken after a prefill chunk ends at the prompt's end or `every` tokens past the last one
    (at most `keep`, the latest kept; on Qwen3-Next-80B one weighs about 75 MB a sequence)."""

    EVERY, KEEP = 4096, 8

    def __init__(self, cfg, layers, xp=np):
        self.xp = xp
        self._on_device = _current_device_and_stream(xp)
        self.conv, self.ssm, self.pos = {}, {}, {}
        self.checkpoints = {}           # position -> {layer: (conv copy, ssm copy)}
        self.every, self.keep = self.EVERY, self.KEEP
        self._replayed = False
        if not layers:                  # a stage of attention layers only: no recurrent shapes
            return
        taps, C = cfg.ssm_conv_kernel, cfg.ssm_conv_channels
        self.conv = {il: xp.zeros((max(taps - 1, 0), C), np.float32) for il in layers}   # (taps-1, C)
        self.ssm = {il: xp.zeros((cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim), np.float32)
                    for il in layers}                                                  # (Hv, dk, dv)
        self.pos = {il: 0 for il in layers}

    def __bool__(self):
        return bool(self.pos)

    def take(self, il, pos0, n_tokens):
        """The (conv, ssm) state of layer il for a chunk of n_tokens at pos0, which the caller
        updates in place; cleared when pos0 is 0. Inside replayed() only the buffers: a captured
        step does its bookkeeping on the host before each replay (step())."""
        if not self._replayed:
            self._advance(il, pos0, n_tokens)
        return self.conv[il], self.ssm[il]

    def _advance(self, il, pos0, n_tokens):
        if pos0 == 0:
            self.conv[il][...] = 0
            self.ssm[il][...] = 0
        if pos0 == 0 or pos0 == self.pos[il]:
            self.pos[il] = pos0 + n_tokens
        else:
            self.pos[il] = -1

    def step(self, pos0, n_tokens=1):
        """What take() does for every layer, for a step whose kernels run elsewhere (a replayed
        graph reads and writes the buffers in place): the positions, and the clear at 0."""
        for il in self.pos:
            self._advance(il, pos0, n_tokens)

    @contextlib.contextmanager
    def replayed(self):
        """take() hands out the buffers only (a graph being captured: its replays are stepped)."""
        self._replayed = True
        try:
            yield
        finally:
            self._replayed = False

    def snapshot(self):
        """Copies of every layer's state and position, for put_back (a graph's warm-up and
        capture run the step's kernels once, which must not count as a token)."""
        return self._copies(), dict(self.pos)

    def put_back(self, snap):
        states, pos = snap
        self._put(states)
        self.pos.update(pos)

    def _copies(self):
        with self._on_device():
            return {il: (self.conv[il].copy(), self.ssm[il].copy()) for il in self.pos}

    def _put(self, states):
        with self._on_device():
            for il, (conv, ssm) in states.items():
                self.conv[il][...] = conv
                self.ssm[il][...] = ssm

    def at(self):
        """The position every layer's state has reached: None with no recurrent layer, -1 when
        unknown (a chunk off the state's position, or layers that differ after a failed chunk)."""
        got = set(self.pos.values())
        if not got:
            return None
        return got.pop() if len(got) == 1 else -1

    def after_chunk(self, end, last):
        """Called by the stage after a prefill chunk that ends at `end` (last: the prompt's end):
        keep a checkpoint there when it is the prompt's end or `every` tokens past the last one."""
        if not self.pos or self.at() != end:
            return
        if not last and end - max((p for p in self.checkpoints if p < end), default=0) < self.every:
            return
        self.checkpoints[end] = self._copies()
        while len(self.checkpoints) > self.keep:
            del self.checkpoints[min(self.checkpoints)]

    def drop_after(self, pos):
        """Forget the checkpoints past pos (their tokens are no longer the cached ones)."""
        for p in [p for p in self.checkpoints if p > pos]:
            del self.checkpoints[p]

    def restore(self, pos):
        """Put every layer's state back to the checkpoint at pos."""
        self._put(self.checkpoints[pos])
        for il in self.checkpoints[pos]:
            self.pos[il] = pos

    def nbytes(self):
        return sum(a.nbytes for d in (self.conv, self.ssm) for a in d.values())


def _current_device_and_stream(xp):
    """A context factory that makes the device and stream current when this is called current
    again (CuPy; nothing for NumPy). The stage makes its states under its own stream, so that the
    checkpoint copies and restores, which the stage chain and the engine call outside a forward,
    stay in the order of the stage's kernels rather than on another stream or device."""
    cuda = getattr(xp, "cuda", None)
    if cuda is None or not hasattr(cuda, "get_current_stream"):
        return contextlib.nullcontext
    device, stream = cuda.Device(), cuda.get_current_stream()

    def on_device():
        stack = contextlib.ExitStack()
        stack.enter_context(device)
        stack.enter_context(stream)
        return stack
    return on_device
