"""Random-weight GGUF files in the layouts llama.cpp's converter writes (`lite synth`).

Benchmarks need real shapes, not real weights: speed does not depend on weight values. A synth file
has the tensor names, shapes (numpy order: rows, cols), types and metadata of a converted model, a
gpt2-style BPE tokenizer, and random weights written as random *valid* quant blocks whose f16 scale
fields are set so that the dequantized weights have std ~0.02 (finite activations, no quantizer run).

    specs = plan("llama", "8b", "Q4_K")          # the tensor table, without writing anything
    synth("qwen3moe", "tiny", "Q4_K", "t.gguf")   # writes the file, layer by layer

Every tensor's bytes come from its own Generator seeded by (seed, crc32(name)), so a file is the same
byte for byte for the same arguments, whatever order tensors are made in.
"""
import functools
import logging
import os
import time
import zlib
from dataclasses import dataclass, replace

import numpy as np
from gguf import GGUFWriter, LlamaFileType
from gguf import quants as gguf_quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from lite.files import synth_archs
from lite.errors import SynthError
from lite.files.synth_vocab import vocab

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Preset:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_text: int            # ordinary BPE tokens (bytes + merges); special tokens follow them
    n_ctx: int
    rope_base: float
    rms_eps: float
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0            # shared expert width (qwen2moe)
    write_head_dim: bool = False   # the converter writes key_length/value_length only when config has head_dim
    sliding_window: int = 0        # gemma3: the local layers' attention window
    ssm: tuple = None              # qwen3next: its Gated DeltaNet sizes (synth_archs.SSM)


# Tiny presets keep every row (ne0) a multiple of 256 so that K and IQ types fit everywhere, and use
# head_dim * n_head != n_embd for qwen (as Qwen3-0.6B / 30B-A3B do) so key_length is exercised, and
# their matrices are non-square so that a swapped (rows, cols) cannot pass unnoticed.
PRESETS = {
    "llama": {
        "tiny": Preset(4, 256, 4, 2, 64, 512, 512, 496, 2048, 500000.0, 1e-5),
        # every matrix's rows a multiple of 1024 values: the GPU's regrouped IQ3_XXS (kernels/iq3_groups.py)
        "small": Preset(2, 1024, 8, 4, 128, 2048, 512, 496, 2048, 500000.0, 1e-5),
        "8b": Preset(32, 4096, 32, 8, 128, 14336, 128256, 128000, 8192, 500000.0, 1e-5),   # Llama 3.0 8B
    },
    "qwen3": {
        "tiny": Preset(4, 256, 4, 2, 128, 512, 600, 560, 4096, 1000000.0, 1e-6, write_head_dim=True),
        "8b": Preset(36, 4096, 32, 8, 128, 12288, 151936, 151643, 40960, 1000000.0, 1e-6,
                     write_head_dim=True),                                                    # Qwen3-8B
    },
    "qwen3moe": {
        "tiny": Preset(4, 256, 4, 2, 128, 1024, 600, 560, 4096, 1000000.0, 1e-6, 8, 2, 512,
                       write_head_dim=True),
        "30b-a3b": Preset(48, 2048, 32, 4, 128, 6144, 151936, 151643, 32768, 1000000.0, 1e-6, 128, 8, 768,
                          write_head_dim=True),                                               # Qwen3-30B-A3B
    },
    "qwen2moe": {k: Preset(**v) for k, v in synth_archs.QWEN2MOE_PRESETS.items()},
    "gemma3": {k: Preset(**v) for k, v in synth_archs.GEMMA3_PRESETS.items()},
    "qwen3next": {k: Preset(**v) for k, v in synth_archs.QWEN3NEXT_PRESETS.items()},
}
ARCHS = tuple(PRESETS)

# Byte offsets of the f16 scale fields inside one block (the first is the scale d; a second one is
# the min / dmin). Every other bit pattern of these blocks is valid, so the rest is random bytes.
_SCALE_OFFSETS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ1_S": (0,), "IQ4_NL": (0,), "IQ4_XS": (0,),
}
FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = FLOAT_TYPES + tuple(_SCALE_OFFSETS)
WEIGHT_STD = 0.02


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple           # numpy order (..., rows, cols); cols is GGUF's ne0
    qtype: str             # GGML type name
    layer: int = -1        # -1 for token_embd / output / output_norm
    fill: float = None     # constant value (norms: 1.0), else random with std `std`
    std: float = WEIGHT_STD

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[QT[self.qtype]]
        return int(np.prod(self.shape)) // block * size


def get_preset(arch, preset) -> Preset:
    if arch not in PRESETS:
        raise SynthError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHS)}")
    if preset not in PRESETS[arch]:
        raise SynthError(f"unknown preset {preset!r} for {arch}; choose one of {', '.join(PRESETS[arch])}")
    return PRESETS[arch][preset]


def _layers(p: Preset, n_layer) -> Preset:
    """The preset with only its first n_layer layers (None: all): a short file in a big model's
    layout, for tests that compare with the CPU."""
    if n_layer is None:
        return p
    if not isinstance(n_layer, int) or not 1 <= n_layer <= p.n_layer:
        raise SynthError(f"layers must be 1..{p.n_layer} for this preset, got {n_layer!r}")
    return replace(p, n_layer=n_layer)


def _check_quant(quant) -> str:
    q = str(quant).upper()
    if q not in QUANT_TYPES:
        raise SynthError(f"unsupported quant type {quant!r}; choose one of {', '.join(QUANT_TYPES)}")
    return q


def _fits(qtype, cols) -> bool:
    return cols % GGML_QUANT_SIZES[QT[qtype]][0] == 0


def plan(arch, preset, quant, n_layer=None) -> list:
    """The tensor table synth writes, in file order: [TensorSpec] (the first n_layer layers only
    when given)."""
    p, q = _layers(get_preset(arch, preset), n_layer), _check_quant(quant)
    # llama.cpp's quantized files keep the embedding and output at Q6_K (a float file keeps them float);
    # where n_embd is no multiple of 256 the K type cannot hold a row, so they take the --quant type.
    big = q if q in FLOAT_TYPES or not _fits("Q6_K", p.n_embd) else "Q6_K"
    q_rows, kv_rows = p.n_head * p.head_dim, p.n_head_kv * p.head_dim

    def mat(name, shape, il, qtype=q, **kw):
        if not _fits(qtype, shape[-1]):
            raise SynthError(f"{name}: rows of {shape[-1]} values are not whole {qtype} blocks of "
                             f"{GGML_QUANT_SIZES[QT[qtype]][0]}; pick another --quant")
        return TensorSpec(name, tuple(shape), qtype, il, **kw)

    def norm(name, n, il):
        return TensorSpec(name, (n,), "F32", il, fill=1.0)

    specs = [mat("token_embd.weight", (p.n_vocab, p.n_embd), -1, big)]
    for il in range(p.n_layer):
        if arch == "qwen3next":
            specs += synth_archs.qwen3next_layer(p, il, mat, norm)
            continue
        b = f"blk.{il}."
        specs += [norm(b + "attn_norm.weight", p.n_embd, il),
                  mat(b + "attn_q.weight", (q_rows, p.n_embd), il),
                  mat(b + "attn_k.weight", (kv_rows, p.n_embd), il),
                  mat(b + "attn_v.weight", (kv_rows, p.n_embd), il),
                  mat(b + "attn_output.weight", (p.n_embd, q_rows), il)]
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            specs += [norm(b + "attn_q_norm.weight", p.head_dim, il),
                      norm(b + "attn_k_norm.weight", p.head_dim, il)]
        specs.append(norm(b + "ffn_norm.weight", p.n_embd, il))
        if p.n_expert:
            e, f = p.n_expert, p.n_ff_exp
            # The router is F32 in llama.cpp's files; a wider std keeps expert choice away from ties.
            specs += [mat(b + "ffn_gate_inp.weight", (e, p.n_embd), il, "F32", std=p.n_embd ** -0.5),
                      mat(b + "ffn_gate_exps.weight", (e, f, p.n_embd), il),
                      mat(b + "ffn_down_exps.weight", (e, p.n_embd, f), il),
                      mat(b + "ffn_up_exps.weight", (e, f, p.n_embd), il)]
        else:
            specs += [mat(b + "ffn_gate.weight", (p.n_ff, p.n_embd), il),
                      mat(b + "ffn_down.weight", (p.n_embd, p.n_ff), il),
                      mat(b + "ffn_up.weight", (p.n_ff, p.n_embd), il)]
        if arch == "qwen2moe":
            specs += synth_archs.qwen2moe_layer_tensors(p, il, mat)
        if arch == "gemma3":
            specs += synth_archs.gemma3_post_norms(il, norm, p.n_embd)
    specs.append(norm("output_norm.weight", p.n_embd, -1))
    if arch != "gemma3":                                   # gemma3's output is token_embd (tied)
        specs.append(mat("output.weight", (p.n_vocab, p.n_embd), -1, big))
    return specs


# ---------------------------------------------------------------- weights

def _f16_bits(x) -> np.ndarray:
    return np.array([x], dtype=np.float16).view(np.uint8)


@functools.lru_cache(maxsize=None)
def block_scales(qtype, std=WEIGHT_STD) -> tuple:
    """Values for the f16 scale fields of `qtype` so that random blocks dequantize to mean ~0, std `std`.

    Measured once on random blocks with gguf-py's reference dequantization (fixed seed, so the result
    and thus every file is deterministic): the min field (if any) is chosen to cancel the mean of the
    scale term, then both are scaled together.
    """
    offs = _SCALE_OFFSETS[qtype]
    block, size = GGML_QUANT_SIZES[QT[qtype]]
    raw = np.random.default_rng(1234).integers(0, 256, (512, size), dtype=np.uint8)

    def values(fields):
        for off, v in zip(offs, fields):
            raw[:, off:off + 2] = _f16_bits(v)
        return gguf_quants.dequantize(raw, QT[qtype]).astype(np.float64).ravel()

    fields = [1.0] + [0.0] * (len(offs) - 1)
    if len(offs) == 2:
        m_scale = values([1.0, 0.0]).mean()
        m_min = values([0.0, 1.0]).mean()
        fields[1] = -m_scale / m_min if m_min else 0.0
    k = std / values(fields).std()
    return tuple(float(np.float16(f * k)) for f in fields)


def tensor_bytes(spec: TensorSpec, seed: int) -> np.ndarray:
    """The bytes of one tensor: (spec.nbytes,) uint8 (F32/F16 come back as their own dtype, same bytes)."""
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    if spec.fill is not None:
        return np.full(spec.shape, spec.fill, dtype=np.float32)
    if spec.qtype in FLOAT_TYPES:
        x = rng.standard_normal(spec.shape, dtype=np.float32)
        x *= np.float32(spec.std)
        if spec.qtype == "F16":
            return x.astype(np.float16)
        if spec.qtype == "BF16":
            return (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation: good enough for noise
        return x
    block, size = GGML_QUANT_SIZES[QT[spec.qtype]]
    n_blocks = spec.nbytes // size
    # random_raw gives 8 random bytes per draw, about twice as fast as integers(dtype=uint8)
    raw = rng.bit_generator.random_raw(-(-spec.nbytes // 8)).view(np.uint8)[:spec.nbytes]
    blocks = raw.reshape(n_blocks, size)
    for off, v in zip(_SCALE_OFFSETS[spec.qtype], block_scales(spec.qtype, spec.std)):
        blocks[:, off:off + 2] = _f16_bits(v)
    return raw


# ---------------------------------------------------------------- the file

def _file_type(q) -> int:
    name = {"F32": "ALL_F32", "Q2_K": "MOSTLY_Q2_K", "Q6_K": "MOSTLY_Q6_K"}.get(q)
    if name is None:
        name = f"MOSTLY_{q}_S" if q in ("Q3_K", "Q4_K", "Q5_K") else f"MOSTLY_{q}"
    return int(LlamaFileType[name])


def _metadata(w: GGUFWriter, arch, preset, p: Preset, q):
    w.add_type("model")
    w.add_name(f"synth {arch} {preset} {q}")
    w.add_description("random weights written by lite synth; for benchmarks and tests, not for use")
    w.add_block_count(p.n_layer)
    w.add_context_length(p.n_ctx)
    w.add_embedding_length(p.n_embd)
    w.add_feed_forward_length(p.n_ff)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    w.add_rope_freq_base(p.rope_base)
    w.add_layer_norm_rms_eps(p.rms_eps)
    if p.n_expert:
        w.add_expert_count(p.n_expert)
        w.add_expert_used_count(p.n_expert_used)
        w.add_expert_feed_forward_length(p.n_ff_exp)
    if arch == "qwen2moe":
        synth_archs.qwen2moe_metadata(w, p)
    if arch == "gemma3":
        synth_archs.gemma3_metadata(w, p)
    if arch == "qwen3next":
        synth_archs.qwen3next_metadata(w, p)
    if p.write_head_dim:
        w.add_key_length(p.head_dim)
        w.add_value_length(p.head_dim)
    w.add_file_type(_file_type(q))
    if arch == "llama":
        w.add_vocab_size(p.n_vocab)
        w.add_rope_dimension_count(p.head_dim)
    v = vocab(arch, p)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(v["pre"])
    w.add_token_list(v["tokens"])
    w.add_token_types([int(t) for t in v["types"]])
    w.add_token_merges(v["merges"])
    w.add_bos_token_id(v["bos"])
    w.add_eos_token_id(v["eos"])
    if v["pad"] is not None:
        w.add_pad_token_id(v["pad"])
    w.add_add_bos_token(v["add_bos"])
    w.add_chat_template(v["template"])
    if q not in FLOAT_TYPES:
        w.add_quantization_version(2)


def synth(arch, preset, quant, out, seed=0, progress=None, n_layer=None) -> dict:
    """Write the file; returns {"path", "n_tensors", "bytes", "seconds"}. n_layer: only the
    preset's first n_layer layers (None: all of them).

    progress(done_layers, n_layer, bytes_written, seconds), if given, is called after each layer.
    Memory stays at about the largest tensor (the embedding): nothing else is held.
    """
    if not isinstance(seed, int) or seed < 0:
        raise SynthError(f"seed must be a non-negative integer, got {seed!r}")
    p, q = _layers(get_preset(arch, preset), n_layer), _check_quant(quant)
    specs = plan(arch, preset, q, n_layer)
    out = os.fspath(out)
    if os.path.isdir(out):
        raise SynthError(f"{out}: is a directory; give a file name such as model.gguf")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise SynthError(f"{out}: directory {parent} does not exist")
    tmp = out + ".part"   # renamed at the end, so an interrupted run never leaves a plausible file
    t0 = time.perf_counter()
    w = GGUFWriter(tmp, arch)
    try:
        _metadata(w, arch, preset, p, q)
        for s in specs:
            # a non-uint8 dtype makes GGUFWriter take the shape as element counts (not bytes)
            w.add_tensor_info(s.name, s.shape, np.dtype(np.float32), s.nbytes, raw_dtype=QT[s.qtype])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        last = {s.layer: i for i, s in enumerate(specs) if s.layer >= 0}   # layer -> its last tensor
        written = 0
        for i, s in enumerate(specs):
            w.write_tensor_data(tensor_bytes(s, seed).view(np.uint8).reshape(-1))
            written += s.nbytes
            if s.layer >= 0 and last[s.layer] == i:
                secs = time.perf_counter() - t0
                log.info("synth: layer %d/%d written, %.2f GB, %.1f s", s.layer + 1, p.n_layer,
                         written / 1e9, secs)
                if progress is not None:
                    progress(s.layer + 1, p.n_layer, written, secs)
        w.close()
        os.replace(tmp, out)
    except OSError as e:
        w.close()
        if os.path.exists(tmp):
            os.remove(tmp)
        raise SynthError(f"{out}: cannot write: {e.strerror or e}") from None
    except BaseException:
        w.close()
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    secs = time.perf_counter() - t0
    return {"path": out, "n_tensors": len(specs), "bytes": os.path.getsize(out), "seconds": secs}
