"""BackendConfig: every setting of the GPU backend that a benchmark may compare, in one object.

The engine builds one (defaults: the paths measured fastest, BENCHMARKS.md) and passes it to each
stage's backend, which passes what a kernel needs down as arguments: no module reads the
environment for these. `lite bench --config pdl=off,iq3_layout=groups4` compares settings.
The one environment variable behind a field is LITE_REFERENCE_KERNELS (docs/configuration.md).
"""
import dataclasses
import os
from dataclasses import dataclass, field

from lite.errors import LiteError


def _reference_default():
    return os.environ.get("LITE_REFERENCE_KERNELS", "") not in ("", "0")


@dataclass(frozen=True)
class BackendConfig:
    # Kernels
    reference_kernels: bool = field(default_factory=_reference_default)  # Numba twins instead of CUDA C
    pdl: bool | None = None           # programmatic dependent launch; None: where compute capability >= 9.0
    int8_dot_types: tuple = ("Q4_K", "Q6_K", "IQ3_XXS")  # dense decode products on dp4a over x as int8
    moe_int8_dot: bool = True         # MoE decode products on the same int8 form (for int8_dot_types)
    # server steps of 9 to 256 rows on the int8 tensor cores (kernels/batched_mma.py: Q4_K, Q5_K, Q6_K, Q8_0,
    # IQ4_XS, IQ3_XXS), capturable up to 256 rows (off until tests/test_batched_mma_gpu.py passes on a GPU)
    batched_mma: bool = False
    epilogues: bool = True            # residual add / gated activation inside the decode product
    fold_norm: bool = True            # decode RMSNorm split across the product before it and after it
    fold_qk_norm: bool = True         # qwen3's per-head q/k norms inside RoPE + KV store
    graph_io: bool = True             # decode graph's token, position and logits through pinned buffers
    gate_up_interleave: bool = True   # [gate; up] stored with rows alternating
    flash_attention: bool = True      # one-pass prefill attention where the head dim allows
    # ... at head dim 256 too (qwen3next's gated attention, gemma3), Q's fragments from shared memory
    # (off until tests/test_flash_attn.py's D = 256 cases pass on a GPU)
    flash_attention_256: bool = False
    # lite serve's prompt chunks: the flash kernel over the paged pool, all of a step's chunks in one
    # launch, instead of each chunk's pages gathered into a contiguous copy every layer (off until
    # tests/test_paged_flash_gpu.py passes on a GPU)
    paged_flash: bool = False
    moe_gated: bool = True            # MoE decode's gate, up and activation in one launch
    iq3_layout: str = "bands16"       # IQ3_XXS on the GPU: "bands16" (tensor cores), "groups4", "file"
    # qwen3next's decode: a recurrent layer's conv, norms, gates and delta rule in one launch, the
    # shared expert's gate in one, and one captured graph per stage with recurrent layers or a
    # shared expert (off until tests/test_qwen3next_gpu.py's graphed-decode tests pass on a GPU)
    hybrid_graphs: bool = False
    # qwen3next's prefill: the chunked delta rule's products on tensor cores (kernels/delta_rule_mma.py),
    # "tf32" or "3xtf32" (fp32's precision), instead of fp32 CUDA cores (off until measured on a GPU)
    delta_rule_mma: str = "off"
    # Experts kept in host RAM (--experts host)
    expert_prefetch: bool = True      # copy the next layer's experts during this layer's compute
    expert_device_cache: bool = True  # decode's expert cache managed on the device (graph-safe)
    expert_prefill_share: float = 0.5  # share of the expert cache kept for prefill
    expert_full_layer: int = 16       # token-slots an expert from which prefill streams whole layers

    def with_settings(self, text):
        """A copy with `key=value,key=value` applied (bench's --config); bad keys or values raise
        LiteError naming them."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        changes = {}
        for item in filter(None, (s.strip() for s in (text or "").split(","))):
            key, sep, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in fields:
                raise LiteError(f"--config: unknown setting {item!r} (known: {', '.join(fields)})")
            changes[key] = _parse(key, value.strip(), getattr(self, key))
        return dataclasses.replace(self, **changes)


CHOICES = {"delta_rule_mma": ("off", "tf32", "3xtf32")}   # str settings with a fixed set of values


def _parse(key, value, current):
    low = value.lower()
    if key in CHOICES:
        if low not in CHOICES[key]:
            raise LiteError(f"--config: {key} takes one of {', '.join(CHOICES[key])}, got {value!r}")
        return low
    if isinstance(current, bool) or current is None:
        if low in ("1", "on", "true", "yes"):
            return True
        if low in ("0", "off", "false", "no"):
            return False
        if low == "auto" and current is None:
            return None
        raise LiteError(f"--config: {key} takes on or off, got {value!r}")
    if isinstance(current, tuple):
        return tuple(v.strip().upper() for v in value.split("+") if v.strip())
    try:
        return type(current)(value)
    except ValueError:
        raise LiteError(f"--config: {key} takes a {type(current).__name__}, got {value!r}") from None
