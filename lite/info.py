"""`lite info`: what is in a GGUF file."""
import os
from collections import Counter

from lite.config import ModelConfig
from lite.errors import ConfigError
from lite.gguf_file import GGUFFile


def describe(path, list_tensors=False) -> str:
    g = GGUFFile(path)
    md = g.metadata
    n_params = sum(t.n_elements for t in g.tensors.values())
    n_bytes = sum(t.nbytes for t in g.tensors.values())
    mix = Counter()
    for t in g.tensors.values():
        mix[t.type_name] += t.n_elements
    lines = [
        f"file:          {g.path} ({os.path.getsize(g.path) / 2**20:.1f} MiB, GGUF v{g.version})",
        f"name:          {md.get('general.name', '?')}",
        f"architecture:  {g.architecture or '?'}",
        f"parameters:    {n_params / 1e6:.1f} M ({n_bytes * 8 / max(n_params, 1):.2f} bits per weight)",
        "quant mix:     " + ", ".join(f"{k} {v / n_params:.1%}" for k, v in mix.most_common()),
    ]
    try:
        cfg = ModelConfig.from_gguf(md, g.path)
        lines += [
            f"context:       {cfg.context_length} tokens",
            f"layers:        {cfg.n_layer}, embedding {cfg.n_embd}, feed-forward {cfg.n_ff}",
            f"attention:     {cfg.n_head} heads, {cfg.n_head_kv} KV heads, head dim {cfg.head_dim}"
            + (f", sliding window {cfg.sliding_window}" if cfg.sliding_window else ""),
            f"vocabulary:    {cfg.n_vocab} ({md.get('tokenizer.ggml.model', '?')} tokenizer)",
        ]
        if cfg.is_hybrid:
            n_rec = sum(cfg.recurrent)
            lines.append(f"layer kinds:   {n_rec} Gated DeltaNet (recurrent), {cfg.n_layer - n_rec} full "
                         f"attention; delta rule {cfg.ssm_k_heads} key / {cfg.ssm_v_heads} value heads")
        if cfg.is_moe:
            lines.append(f"experts:       {cfg.n_expert}, {cfg.n_expert_used} used, ffn {cfg.n_ff_expert}"
                         + (f", shared expert ffn {cfg.n_ff_shexp}" if cfg.n_ff_shexp else ""))
    except ConfigError as e:
        lines.append(f"note:          lite cannot run this file: {e}")
    lines.append(f"chat template: {'yes' if 'tokenizer.chat_template' in md else 'no'}")
    if list_tensors:
        lines.append("")
        lines.append(f"{'name':40s} {'type':8s} shape")
        for t in g.tensors.values():
            lines.append(f"{t.name:40s} {t.type_name:8s} {' x '.join(map(str, t.shape))}")
    return "\n".join(lines)


def verify(path, progress=None):
    """Check every tensor (sizes, finite after dequantization), the layers block_count promises,
    and, for a file lite fetches, its sha256. Returns (summary lines, problem lines)."""
    from lite.verify import check_layers, check_tensor, file_sha256, known_file_digest
    g = GGUFFile(path)           # parsing already checks each tensor's size against the file
    problems = []
    try:
        check_layers(g, ModelConfig.from_gguf(g.metadata, g.path).n_layer)
    except ConfigError as e:
        problems.append(str(e))
    for t in g.tensors.values():
        r = check_tensor(t)
        if not r.ok:
            problems.append(r.describe())
        if progress is not None:
            progress.update(t.nbytes)
    lines = [f"verify:        {len(g.tensors)} tensors checked (sizes, finite after dequantization): "
             + (f"{len(problems)} problem(s)" if problems else "all good")]
    known = known_file_digest(g.path)
    if known is not None:
        alias, want = known
        got = file_sha256(g.path)
        if got == want:
            lines.append(f"sha256:        {got} (the published {alias} file)")
        else:
            problems.append(f"sha256 {got} differs from the published {alias} file's {want}")
    return lines, problems
