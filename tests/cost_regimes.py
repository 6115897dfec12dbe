"""Synthetic devices for the chunk heuristic's tests: a "true" cost of one chunk through the whole
layer stack for each regime of issue 28 (dense 8B, 30B-A3B with experts on the GPU, experts
streamed from the host through caches of 25/50/100%, over 1/2/4 devices or virtual stages),
written with terms the cost model does not have (expert copies overlapping compute), and cost
tables made from them by the chain's step-by-step schedule. Constants are of the H200's order;
the tests need their shape, not their values."""
from dataclasses import dataclass

import numpy as np

from lite.chain.chunking import chain_time, even_sizes

FIXED_CHUNKS = (1024, 2048, 4096, 8192, 16384)
PROMPTS = (2048, 8192, 32768)
E, TOP_K = 128, 8                        # Qwen3-30B-A3B's routing
EXPERT_BYTES = 94e6                      # one expert over all 48 MoE layers (IQ3_XXS)
LINK_BYTES_S = 50e9                      # pinned host to device


def distinct(c):
    return E * (1 - (1 - TOP_K / E) ** np.asarray(c, float))


@dataclass(frozen=True)
class Regime:
    name: str
    fixed: float                 # per chunk, whole stack
    per_token: float
    knee: int                    # GEMMs cost as much as this many tokens below it
    attn: float                  # per token per context token
    attn_chunk: float            # per causal pair inside the chunk (2x attn: masked tiles computed)
    expert_hbm: float = 0.0      # per distinct expert read from VRAM
    cache: float = 1.0           # share of experts the GPU cache holds (host experts)
    host: bool = False
    devices: int = 1
    per_device: int = 1
    stage_fixed: float = 3e-4
    handoff: float = 5e-7
    moe: bool = False

    def chunk_seconds(self, c, pos):
        """The true seconds of one chunk through the whole stack on one device: compute, plus the
        copy of the experts that miss the cache, which overlaps compute but for a tenth of it."""
        c = np.asarray(c, float)
        compute = (self.fixed + self.per_token * np.maximum(c, self.knee)
                   + self.attn * c * pos + self.attn_chunk * c * (c + 1) / 2
                   + self.expert_hbm * (distinct(c) if self.moe else 0))
        if not self.host:
            return compute
        copy = distinct(c) * EXPERT_BYTES * (1 - self.cache) / LINK_BYTES_S
        return np.maximum(compute, copy) + 0.1 * np.minimum(compute, copy)

    def device_times(self, sizes, start=0):
        sizes = np.asarray(sizes, float)
        pos = start + np.concatenate([[0.0], np.cumsum(sizes)[:-1]])
        k, S = self.per_device, self.devices
        hand = k * self.handoff * sizes if S * k > 1 else 0.0
        return k * self.stage_fixed + hand + self.chunk_seconds(sizes, pos) / S

    def prefill_seconds(self, prompt, chunk):
        """The chain's makespan for a chunk size or a schedule (hand-off depth 1)."""
        sizes = even_sizes(prompt, chunk) if np.isscalar(chunk) else list(chunk)
        return chain_time(list(self.device_times(sizes)), self.devices)

    def measure(self, rng, noise=0.02):
        """A calibration measure_fn with up to `noise` added (noise only slows a run)."""
        return lambda c, ctx: float(self.chunk_seconds(c, ctx)) * (1 + noise * rng.random())

    def handoff_fn(self, rng, noise=0.02):
        return lambda n: (self.stage_fixed + self.handoff * n) * (1 + noise * rng.random())


DENSE_8B = Regime("8b", fixed=1.5e-3, per_token=3.0e-5, knee=512, attn=1.0e-9, attn_chunk=2.0e-9)
MOE_GPU = Regime("30b-gpu", fixed=4e-3, per_token=3.5e-5, knee=1024, attn=0.5e-9,
                 attn_chunk=1.0e-9, expert_hbm=2e-5, moe=True)


def regimes():
    """{name: Regime} over the issue's settings and stage layouts."""
    out = {}
    for S, k in ((1, 1), (2, 1), (4, 1), (1, 2), (1, 4)):
        lay = f"{S}x{k}"
        out[f"8b-{lay}"] = Regime(**{**DENSE_8B.__dict__, "name": f"8b-{lay}",
                                     "devices": S, "per_device": k})
    out["30b-gpu"] = MOE_GPU
    for cache in (1.0, 0.5, 0.25):
        for S in (1, 2):
            name = f"30b-host{int(cache * 100)}-{S}x1"
            out[name] = Regime(**{**MOE_GPU.__dict__, "name": name, "host": True, "cache": cache,
                                  "devices": S})
    return out


def table(regime, prompts=PROMPTS, chunks=FIXED_CHUNKS):
    """{prompt: {chunk: seconds}}: the regime's cost table over fixed chunks (capped at the prompt)."""
    return {P: {min(c, P): regime.prefill_seconds(P, min(c, P)) for c in chunks} for P in prompts}
