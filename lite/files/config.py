"""ModelConfig: the one place that reads a model's GGUF metadata keys."""
import math
from dataclasses import dataclass, field

from lite.errors import ConfigError

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "qwen2moe", "gemma3", "qwen3next")


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int            # key length per head
    v_head_dim: int
    n_ff: int
    n_vocab: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_neox: bool          # rotate halves (NEOX) rather than adjacent pairs (llama's NORM)
    act: str                 # "silu" or "gelu_tanh" (gated FFN either way)
    attn_scale: float
    embed_scale: float = 1.0
    qk_norm: bool = False
    post_norms: bool = False  # gemma3: norms after attention and after the FFN
    attn_bias: bool = False   # qwen2
    sliding_window: int = 0
    swa_pattern: int = 0      # every swa_pattern-th layer is global (gemma3: 6)
    rope_base_swa: float = 0.0
    rope_freq_scale: float = 1.0   # linear RoPE scaling (1 / factor); sliding-window layers keep 1
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    expert_weights_norm: bool = True   # renormalize the top-k router weights to sum to one
    n_ff_shexp: int = 0      # qwen2moe: width of the shared expert (0: no shared expert)
    # qwen3next (hybrid): Gated DeltaNet layers (True) among the full-attention ones
    recurrent: tuple = ()
    ssm_conv_kernel: int = 0  # causal conv taps
    ssm_k_heads: int = 0      # key heads Hk (ssm.group_count)
    ssm_v_heads: int = 0      # value heads Hv (ssm.time_step_rank)
    ssm_k_dim: int = 0        # key head dim dk (ssm.state_size)
    ssm_v_dim: int = 0        # value head dim dv (ssm.inner_size / Hv)
    extra: dict = field(default_factory=dict, compare=False)

    def is_swa_layer(self, il: int) -> bool:
        """Sliding-window (local) layer? llama.cpp's pattern: the last of every swa_pattern is global."""
        return bool(self.sliding_window and self.swa_pattern and (il % self.swa_pattern) < self.swa_pattern - 1)

    def layer_rope_base(self, il: int) -> float:
        return self.rope_base_swa if self.is_swa_layer(il) else self.rope_base

    def layer_rope_scale(self, il: int) -> float:
        return 1.0 if self.is_swa_layer(il) else self.rope_freq_scale

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_hybrid(self) -> bool:
        """Some layers keep a recurrent state (conv window and delta-rule matrix), not a KV cache."""
        return any(self.recurrent)

    def is_recurrent_layer(self, il: int) -> bool:
        return bool(self.recurrent) and self.recurrent[il]

    @property
    def ssm_conv_channels(self) -> int:
        """Channels of the causal conv: q and k of every key head, v of every value head."""
        return 2 * self.ssm_k_heads * self.ssm_k_dim + self.ssm_v_heads * self.ssm_v_dim

    @classmethod
    def from_gguf(cls, md: dict, path: str = "") -> "ModelConfig":
        where = f"{path}: " if path else ""
        arch = md.get("general.architecture")
        if arch is None:
            raise ConfigError(f"{where}metadata has no general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ConfigError(f"{where}unsupported architecture {arch!r}; "
                              f"supported: {', '.join(SUPPORTED_ARCHS)}")

        def get(key, default=...):
            full = f"{arch}.{key}"
            if full in md:
                return md[full]
            if default is ...:
                raise ConfigError(f"{where}metadata key {full!r} is missing")
            return default

        def scalar(v):
            # some converters write per-layer arrays (e.g. head_count_kv); all layers alike here
            if hasattr(v, "__len__") and not isinstance(v, str):
                vals = set(int(x) for x in v)
                if len(vals) != 1:
                    raise ConfigError(f"{where}per-layer values {sorted(vals)} are not supported")
                return vals.pop()
            return v

        n_embd = int(get("embedding_length"))
        n_head = int(scalar(get("attention.head_count")))
        n_head_kv = int(scalar(get("attention.head_count_kv", n_head)))
        head_dim = int(get("attention.key_length", n_embd // n_head))
        v_head_dim = int(get("attention.value_length", head_dim))
        tokens = md.get("tokenizer.ggml.tokens")
        n_vocab = int(get("vocab_size", len(tokens) if tokens is not None else 0))
        if n_vocab <= 0:
            raise ConfigError(f"{where}neither {arch}.vocab_size nor tokenizer.ggml.tokens is present")
        for name, v in (("attention.head_count", n_head), ("attention.head_count_kv", n_head_kv),
                        ("embedding_length", n_embd)):
            if v <= 0:
                raise ConfigError(f"{where}{arch}.{name} must be positive, got {v}")
        if n_head % n_head_kv:
            raise ConfigError(f"{where}head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")

        scaling = get("rope.scaling.type", "none")
        factor = float(get("rope.scaling.factor", 1.0) or 1.0)
        if scaling not in ("none", "linear") and factor != 1.0:
            raise ConfigError(f"{where}RoPE scaling {scaling!r} is not supported (linear is)")
        common = dict(
            arch=arch, n_layer=int(get("block_count")), n_embd=n_embd, n_head=n_head,
            n_head_kv=n_head_kv, head_dim=head_dim, v_head_dim=v_head_dim,
            n_ff=int(scalar(get("feed_forward_length", 0))), n_vocab=n_vocab,
            context_length=int(get("context_length", 4096)),
            rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_base=float(get("rope.freq_base", 10000.0)),
            rope_dim=int(get("rope.dimension_count", head_dim)),
            attn_scale=1.0 / math.sqrt(head_dim),
            rope_freq_scale=1.0 / factor if scaling == "linear" else 1.0,
        )
        if arch == "llama":
            return cls(**common, rope_neox=False, act="silu")
        if arch == "qwen2":
            return cls(**common, rope_neox=True, act="silu", attn_bias=True)
        if arch == "qwen3":
            return cls(**common, rope_neox=True, act="silu", qk_norm=True)
        if arch == "qwen3moe":
            return cls(**common, rope_neox=True, act="silu", qk_norm=True,
                       n_expert=int(get("expert_count")), n_expert_used=int(get("expert_used_count")),
                       n_ff_expert=int(get("expert_feed_forward_length")))
        if arch == "qwen2moe":
            # qwen2's attention with experts and a shared expert; llama.cpp's llm_build_qwen2moe
            # passes norm_w=false (the top-k weights stay as the softmax gave them) and falls back
            # to n_ff / n_expert_used and n_ff when the expert widths are absent.
            n_used = int(get("expert_used_count"))
            n_ff_shexp = int(get("expert_shared_feed_forward_length", common["n_ff"]))
            if n_used <= 0 or n_ff_shexp <= 0:
                raise ConfigError(f"{where}qwen2moe needs expert_used_count and a shared expert width "
                                  f"(expert_shared_feed_forward_length or feed_forward_length) > 0")
            return cls(**common, rope_neox=True, act="silu", attn_bias=True,
                       n_expert=int(get("expert_count")), n_expert_used=n_used,
                       n_ff_expert=int(get("expert_feed_forward_length", common["n_ff"] // n_used)),
                       expert_weights_norm=False, n_ff_shexp=n_ff_shexp)
        if arch == "qwen3next":
            return cls(**common, rope_neox=True, act="silu", qk_norm=True,
                       **_qwen3next_fields(get, common, where))
        # gemma3
        return cls(**common, rope_neox=True, act="gelu_tanh", qk_norm=True, post_norms=True,
                   embed_scale=math.sqrt(n_embd),
                   sliding_window=int(get("attention.sliding_window", 0)), swa_pattern=6,
                   rope_base_swa=10000.0)


def _qwen3next_fields(get, common, where):
    """The hybrid's MoE and Gated DeltaNet keys (llama.cpp's qwen3next loader): which layers are
    recurrent comes from attention.recurrent_layers when present, else every
    full_attention_interval-th layer is full attention."""
    n_layer = common["n_layer"]
    flags = get("attention.recurrent_layers", None)
    if flags is not None:
        recurrent = tuple(bool(f) for f in flags)
        if len(recurrent) < n_layer:
            raise ConfigError(f"{where}qwen3next.attention.recurrent_layers has {len(recurrent)} "
                              f"entries for {n_layer} layers")
        recurrent = recurrent[:n_layer]
    else:
        interval = int(get("full_attention_interval", 4))
        if interval < 1:
            raise ConfigError(f"{where}qwen3next.full_attention_interval must be positive, got {interval}")
        recurrent = tuple((i + 1) % interval != 0 for i in range(n_layer))
    hk, hv = int(get("ssm.group_count")), int(get("ssm.time_step_rank"))
    dk, inner, taps = int(get("ssm.state_size")), int(get("ssm.inner_size")), int(get("ssm.conv_kernel"))
    if min(hk, hv, dk, inner, taps) <= 0 or hv % hk or inner % hv:
        raise ConfigError(f"{where}qwen3next ssm sizes do not fit together: group_count {hk}, "
                          f"time_step_rank {hv} (a multiple of it), state_size {dk}, "
                          f"inner_size {inner} (a multiple of time_step_rank), conv_kernel {taps}")
    n_used = int(get("expert_used_count"))
    n_ff_shexp = int(get("expert_shared_feed_forward_length", common["n_ff"]))
    return dict(n_expert=int(get("expert_count")), n_expert_used=n_used,
                n_ff_expert=int(get("expert_feed_forward_length", common["n_ff"] // max(n_used, 1))),
                n_ff_shexp=n_ff_shexp, recurrent=recurrent, ssm_conv_kernel=taps,
                ssm_k_heads=hk, ssm_v_heads=hv, ssm_k_dim=dk, ssm_v_dim=inner // hv)
