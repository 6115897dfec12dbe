"""qwen3next: the hybrid of Gated DeltaNet (linear attention with a recurrent state) and gated full
attention, every layer with a MoE FFN and a shared expert behind a sigmoid gate (Qwen3-Next).

Every layer: x += mixer(rms(x) * attn_norm); x += moe(rms(x) * post_attention_norm). The mixer is
a Gated DeltaNet on recurrent layers (cfg.is_recurrent_layer) and gated attention on the others.
Norm weights in the file already hold the 1 that HF adds, so every norm is a plain rms_norm.

Shapes: x (T, n_embd); recurrent layers: qkv (T, C) with C = 2 Hk dk + Hv dv, rows
[q of all key heads | k of all key heads | v of all value heads], value head j in key head
j // (Hv / Hk); conv state (taps-1, C), delta-rule state (Hv, dk, dv), both in kv.recurrent.
"""
from lite.errors import ConfigError
from lite.models.qwen3moe import moe_block


def gated_attention_block(ops, cfg, il, h, kv, pos0):
    """attn_q gives per head [q | output gate]; q, k RMS-normed per head, RoPE (NEOX) on the
    first rope_dim dims only; causal GQA attention; o * sigmoid(gate) -> attn_output."""
    p = f"blk.{il}."
    T, H, D = h.shape[0], cfg.n_head, cfg.head_dim
    qg, k, v = ops.linear_many(h, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"])
    qg = qg.reshape(T, H, 2 * D)
    q, gate = qg[:, :, :D], qg[:, :, D:]
    k = k.reshape(T, cfg.n_head_kv, D)
    v = v.reshape(T, cfg.n_head_kv, cfg.v_head_dim)
    q = ops.rms_norm(q, p + "attn_q_norm.weight", cfg.rms_eps)
    k = ops.rms_norm(k, p + "attn_k_norm.weight", cfg.rms_eps)
    q = ops.rope(q, pos0, cfg.rope_base, True, cfg.rope_dim, cfg.rope_freq_scale)
    k = ops.rope(k, pos0, cfg.rope_base, True, cfg.rope_dim, cfg.rope_freq_scale)
    o = ops.attention(kv, il, q, k, v, pos0, cfg.attn_scale)            # (T, H * Dv)
    o = ops.sigmoid_mul(o, gate.reshape(T, H * D))
    return ops.linear(o, p + "attn_output.weight")


def qkv_and_gate(ops, cfg, il, h):
    """(qkv (T, C), z (T, Hv * dv)): from attn_qkv and attn_gate, or from the older fused ssm_in,
    whose rows are per key head [q | k | v of its value heads | z of its value heads]."""
    p = f"blk.{il}."
    if ops.has(p + "attn_qkv.weight"):
        return ops.linear_many(h, [p + "attn_qkv.weight", p + "attn_gate.weight"])
    T, Hk, dk = h.shape[0], cfg.ssm_k_heads, cfg.ssm_k_dim
    rv = cfg.ssm_v_heads // Hk * cfg.ssm_v_dim          # v (and z) width of one key head's group
    m = ops.linear(h, p + "ssm_in.weight").reshape(T, Hk, 2 * dk + 2 * rv)
    q, k = m[:, :, :dk], m[:, :, dk:2 * dk]
    v, z = m[:, :, 2 * dk:2 * dk + rv], m[:, :, 2 * dk + rv:]
    qkv = ops.concat([q.reshape(T, Hk * dk), k.reshape(T, Hk * dk), v.reshape(T, Hk * rv)])
    return qkv, z.reshape(T, Hk * rv)


def delta_net_block(ops, cfg, il, h, kv, pos0):
    """Gated DeltaNet: causal conv (+ silu) over q|k|v with the carried window, L2-normed q and k,
    the gated delta rule on the carried state, RMS norm * silu(z), ssm_out."""
    p = f"blk.{il}."
    T, Hk, Hv = h.shape[0], cfg.ssm_k_heads, cfg.ssm_v_heads
    dk, dv, r = cfg.ssm_k_dim, cfg.ssm_v_dim, cfg.ssm_v_heads // cfg.ssm_k_heads
    conv_state, ssm_state = ops.recurrent_state(kv, il, pos0, T)
    qkv, z = qkv_and_gate(ops, cfg, il, h)
    ba = ops.linear(h, p + "ssm_ba.weight")                           # per key head [b | a]
    if T == 1 and ops.fused_delta_step:             # all of it in one launch
        o = ops.delta_step(qkv, ba, (p + "ssm_conv1d.weight", p + "ssm_a", p + "ssm_dt.bias"),
                           conv_state, ssm_state, cfg.rms_eps, 1.0 / dk ** 0.5)
    else:
        ba = ba.reshape(T, Hk, 2 * r)
        g, beta = ops.delta_gates(ba[:, :, :r].reshape(T, Hv), ba[:, :, r:].reshape(T, Hv),
                                  p + "ssm_a", p + "ssm_dt.bias")
        c = ops.conv_silu(qkv, p + "ssm_conv1d.weight", conv_state)   # (T, C)
        q = ops.l2_norm(c[:, :Hk * dk].reshape(T, Hk, dk), cfg.rms_eps)
        k = ops.l2_norm(c[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk), cfg.rms_eps)
        v = c[:, 2 * Hk * dk:].reshape(T, Hv, dv)
        o = ops.delta_rule(q, k, v, g, beta, ssm_state, 1.0 / dk ** 0.5)   # (T, Hv, dv)
    # the norm per head over rows (T * Hv, dv): the CUDA backend leaves a (1, heads, dim) norm for
    # attention's RoPE launch (NormLater), and this one feeds act_mul
    o = ops.rms_norm(o.reshape(T * Hv, dv), p + "ssm_norm.weight", cfg.rms_eps)
    o = ops.act_mul(z.reshape(T * Hv, dv), o, "silu")
    return ops.linear(o.reshape(T, Hv * dv), p + "ssm_out.weight")


def forward_layer(ops, cfg, il, x, kv, pos0):
    p = f"blk.{il}."
    h = ops.rms_norm(x, p + "attn_norm.weight", cfg.rms_eps)
    mixer = delta_net_block if cfg.is_recurrent_layer(il) else gated_attention_block
    x = ops.add(x, mixer(ops, cfg, il, h, kv, pos0))
    h = ops.rms_norm(x, p + "post_attention_norm.weight", cfg.rms_eps)
    return moe_block(ops, cfg, il, h, residual=x)


def expected_shapes(cfg, il, tensors):
    """{name: numpy shape} that layer il needs; the linear layer's projections in whichever
    layout the file has (attn_qkv + attn_gate, or ssm_in)."""
    p, E = f"blk.{il}.", cfg.n_embd
    want = {p + "attn_norm.weight": (E,), p + "post_attention_norm.weight": (E,),
            p + "ffn_gate_inp.weight": (cfg.n_expert, E),
            p + "ffn_gate_exps.weight": (cfg.n_expert, cfg.n_ff_expert, E),
            p + "ffn_up_exps.weight": (cfg.n_expert, cfg.n_ff_expert, E),
            p + "ffn_down_exps.weight": (cfg.n_expert, E, cfg.n_ff_expert),
            p + "ffn_gate_shexp.weight": (cfg.n_ff_shexp, E), p + "ffn_up_shexp.weight": (cfg.n_ff_shexp, E),
            p + "ffn_down_shexp.weight": (E, cfg.n_ff_shexp)}
    if not cfg.is_recurrent_layer(il):
        H, D, Hkv = cfg.n_head, cfg.head_dim, cfg.n_head_kv
        want.update({p + "attn_q.weight": (2 * H * D, E), p + "attn_k.weight": (Hkv * D, E),
                     p + "attn_v.weight": (Hkv * cfg.v_head_dim, E), p + "attn_q_norm.weight": (D,),
                     p + "attn_k_norm.weight": (D,), p + "attn_output.weight": (E, H * cfg.v_head_dim)})
        return want
    Hv, C, inner = cfg.ssm_v_heads, cfg.ssm_conv_channels, cfg.ssm_v_heads * cfg.ssm_v_dim
    if p + "ssm_in.weight" in tensors and p + "attn_qkv.weight" not in tensors:
        want[p + "ssm_in.weight"] = (C + inner, E)
    else:
        want.update({p + "attn_qkv.weight": (C, E), p + "attn_gate.weight": (inner, E)})
    want.update({p + "ssm_ba.weight": (2 * Hv, E), p + "ssm_conv1d.weight": (C, cfg.ssm_conv_kernel),
                 p + "ssm_a": (Hv,), p + "ssm_dt.bias": (Hv,), p + "ssm_norm.weight": (cfg.ssm_v_dim,),
                 p + "ssm_out.weight": (E, inner)})
    return want


# The ops this family needs beyond those of the other families.
HYBRID_OPS = ("sigmoid_mul", "l2_norm", "concat", "delta_gates", "conv_silu", "delta_rule",
              "recurrent_state")


def check_backend(backend_cls):
    """One line when the backend lacks the hybrid's ops (the CPU and CUDA backends have them)."""
    missing = backend_cls.lacks(HYBRID_OPS)
    if missing:
        raise ConfigError(f"qwen3next does not run on the {backend_cls.name} backend yet (it has no "
                          f"{', '.join(missing)}): use --device cpu")


def _squeeze(shape):
    """A shape without its 1s (the shared-expert gate is (1, E) in some files, (E,) in others)."""
    return tuple(d for d in shape if d != 1)


def check_tensors(gguf, cfg, layers):
    """One line naming the first tensor of these layers that is missing or has the wrong shape."""
    for il in layers:
        want = expected_shapes(cfg, il, gguf.tensors)
        want[f"blk.{il}.ffn_gate_inp_shexp.weight"] = (cfg.n_embd,)
        for name, shape in want.items():
            t = gguf.tensors.get(name)
            if t is None:
                raise ConfigError(f"{gguf.path}: qwen3next tensor {name} is missing (expected "
                                  f"shape {shape})")
            if _squeeze(t.shape) != _squeeze(shape):
                raise ConfigError(f"{gguf.path}: qwen3next tensor {name} has shape {t.shape}, "
                                  f"expected {shape}")
