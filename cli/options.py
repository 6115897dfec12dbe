"""The flags shared by the commands that load a model, and the checks of their values: a bad value
is one line naming the flag (click's BadParameter; `lite` exits 1 for it)."""
import functools
import math

import click

from lite.engine.kv_cache import KV_KINDS

DEVICE = click.Choice(["auto", "cpu", "cuda"])


def _positive(ctx, param, value):
    if value is not None and value <= 0:
        raise click.BadParameter(f"must be positive, got {value}")
    return value


def count_or_all(ctx, param, value):
    """A positive count, or -1: as many as fit (llama.cpp's -n -1)."""
    if value is not None and value != -1 and value <= 0:
        raise click.BadParameter(f"must be a positive count, or -1 for no limit, got {value}")
    return value


def seed_value(ctx, param, value):
    """A seed >= 0, or -1 (or none): a random one."""
    if value is not None and value < -1:
        raise click.BadParameter(f"must be >= 0, or -1 for a random seed, got {value}")
    return None if value == -1 else value


def finite(low=None, high=None, low_open=False):
    """A callback for a float flag: finite (no nan, no inf) and within the bounds."""
    def check(ctx, param, value):
        if value is None:
            return value
        if not math.isfinite(value):
            raise click.BadParameter(f"must be a finite number, got {value}")
        if low is not None and (value < low or (low_open and value == low)):
            raise click.BadParameter(f"must be {'>' if low_open else '>='} {low}, got {value}")
        if high is not None and value > high:
            raise click.BadParameter(f"must be <= {high}, got {value}")
        return value
    return check


def non_negative(ctx, param, value):
    if value is not None and value < 0:
        raise click.BadParameter(f"must be >= 0, got {value}")
    return value


def _chunk(ctx, param, value):
    """auto or a token count; `lite bench` also takes a comma list (one row per value)."""
    if value is None:
        return value
    items = value.split(",")
    if len(items) > 1 and ctx.info_name != "bench":
        raise click.BadParameter(f"expected auto or one token count, got {value!r} "
                                 "(lists are for `lite bench`)")
    out = []
    for v in items:
        if v == "auto":
            out.append(v)
            continue
        try:
            n = int(v)
        except ValueError:
            n = 0
        if n <= 0:
            raise click.BadParameter(f"expected auto or a positive token count, got {v!r}")
        out.append(n)
    return out if len(out) > 1 else out[0]


def engine_kwargs(device, max_context, kv, prefill_chunk, layer_split, pipeline, handoff_depth,
                  devices, handoff, handoff_stream, experts="auto", expert_cache="auto", strict=False):
    return dict(device=device, max_context=max_context, kv=kv, prefill_chunk=prefill_chunk,
                layer_split=parse_split(layer_split), pipeline=pipeline, handoff_depth=handoff_depth,
                devices=devices, handoff=handoff, handoff_stream=handoff_stream, experts=experts,
                expert_cache=expert_cache, strict=strict)


def _expert_cache(ctx, param, value):
    from lite.backends.experts import parse_cache
    try:
        parse_cache(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


def model_options(f):
    """Options shared by every command that loads a model."""
    f = click.option("--strict", is_flag=True,
                     help="Make the warnings about settings errors: -c above the model's trained "
                     "context, chat with a model that has no chat template.")(f)
    f = click.option("--expert-cache", default="auto", callback=_expert_cache, metavar="auto|GiB|N%|off",
                     show_default=True, help="GPU cache for experts kept off the GPU: auto (what VRAM "
                     "allows), a size in GiB, a share of the experts (e.g. 25%), or off (one layer's "
                     "staging, nothing kept).")(f)
    f = click.option("--experts", default="auto", type=click.Choice(["auto", "gpu", "host", "mmap"]),
                     show_default=True, help="Where MoE experts live: on the GPU, in pinned host RAM, "
                     "or in the file's mapped pages; auto: the GPU when they fit.")(f)
    f = click.option("--layer-split", default=None, metavar="auto|N0,N1,..",
                     help="Split the layers into pipeline stages: a count per stage (default: one stage).")(f)
    f = click.option("--handoff-stream", is_flag=True,
                     help="Copy hand-offs on a separate stream per stage, so that a chunk's copy "
                     "overlaps the next chunk's compute (GPU stages; with host or p2p).")(f)
    f = click.option("--handoff", default="host", type=click.Choice(["host", "p2p", "auto"]),
                     show_default=True, help="How hidden states pass between stages: host (through "
                     "pinned host memory), p2p (GPU to GPU, where every pair of neighbouring GPUs "
                     "can reach each other), or auto (p2p where it can, else host).")(f)
    f = click.option("--devices", default=None, metavar="0,1,..",
                     help="The GPU of each stage (one stage per GPU unless --layer-split says more).")(f)
    f = click.option("--handoff-depth", default=1, type=click.IntRange(1, 2), show_default=True,
                     help="Chunks a stage may hand its successor before waiting for it.")(f)
    f = click.option("--pipeline", default="chain", type=click.Choice(["chain", "sync"]),
                     show_default=True, help="chain: stages overlap on a long prompt; sync: each "
                     "stage waits for the rest of the chain (for comparison).")(f)
    f = click.option("--prefill", "prefill_chunk", default=None, callback=_chunk,
                     metavar="auto|N", help="Prefill chunk in tokens, or auto: chosen from the "
                     "prompt length and stage count by a cost model (default 512). `lite bench` "
                     "takes a list: auto,1024,2048.")(f)
    f = click.option("--kv", default="f16", type=click.Choice(KV_KINDS), show_default=True,
                     help="KV cache element type; int8 halves its memory.")(f)
    f = click.option("-c", "--ctx-size", "--max-context", "max_context", default=None, type=int,
                     callback=_positive,
                     help="Positions the KV cache holds (default: min(4096, the model's context)).")(f)
    f = click.option("--device", default="auto", type=DEVICE, show_default=True,
                     help="auto uses the GPU when one is usable, else the CPU.")(f)
    return f


def sampling_options(f):
    """The sampling flags, gathered into one `sampling` dict for LLM.stream()."""
    names = ("temp", "top_k", "top_p", "min_p", "repeat_penalty", "seed")

    @functools.wraps(f)
    def wrapper(*args, **kw):
        vals = {n: kw.pop(n) for n in names}
        vals["temperature"] = vals.pop("temp")
        return f(*args, sampling=vals, **kw)
    for opt in reversed([
        click.option("--temp", default=0.8, type=float, callback=finite(0), show_default=True,
                     help="Temperature; 0 is greedy."),
        click.option("--top-k", default=40, type=int, callback=non_negative, show_default=True,
                     help="0 disables."),
        click.option("--top-p", default=0.95, type=float, callback=finite(0, 1, low_open=True),
                     show_default=True),
        click.option("--min-p", default=0.05, type=float, callback=finite(0, 1), show_default=True),
        click.option("--repeat-penalty", default=1.0, type=float, callback=finite(0, low_open=True),
                     show_default=True, help="1.0 disables."),
        click.option("--seed", default=None, type=int, callback=seed_value,
                     help="Random seed (same seed, same text); -1 or none: a random one."),
    ]):
        wrapper = opt(wrapper)
    return wrapper


def parse_split(spec):
    if spec in (None, "auto"):
        return spec
    try:
        counts = [int(x) for x in spec.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected auto or comma-separated layer counts, got {spec!r}",
                                 param_hint="--layer-split") from None
    return counts[0] if len(counts) == 1 else counts
