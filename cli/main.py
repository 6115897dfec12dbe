"""The `lite` command. Errors a user can act on print one line and exit non-zero, never a traceback."""
import functools
import logging
import os
import sys

import click

from lite.errors import LiteError
from lite.kv_cache import KV_KINDS

DEVICE = click.Choice(["auto", "cpu", "cuda"])


def _positive(ctx, param, value):
    if value is not None and value <= 0:
        raise click.BadParameter(f"must be positive, got {value}")
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
                  devices, handoff, handoff_stream, experts="auto", expert_cache="auto"):
    return dict(device=device, max_context=max_context, kv=kv, prefill_chunk=prefill_chunk,
                layer_split=parse_split(layer_split), pipeline=pipeline, handoff_depth=handoff_depth,
                devices=devices, handoff=handoff, handoff_stream=handoff_stream, experts=experts,
                expert_cache=expert_cache)


def _expert_cache(ctx, param, value):
    from lite.experts import parse_cache
    try:
        parse_cache(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


def model_options(f):
    """Options shared by every command that loads a model."""
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
    f = click.option("-c", "--max-context", default=None, type=int, callback=_positive,
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
        click.option("--temp", default=0.8, type=click.FloatRange(min=0), show_default=True,
                     help="Temperature; 0 is greedy."),
        click.option("--top-k", default=40, type=click.IntRange(min=0), show_default=True,
                     help="0 disables."),
        click.option("--top-p", default=0.95, type=click.FloatRange(0, 1, min_open=True),
                     show_default=True),
        click.option("--min-p", default=0.05, type=click.FloatRange(0, 1), show_default=True),
        click.option("--repeat-penalty", default=1.0, type=click.FloatRange(min=0, min_open=True),
                     show_default=True, help="1.0 disables."),
        click.option("--seed", default=None, type=int, help="Random seed (same seed, same text)."),
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lite", prog_name="lite")
@click.option("-v", "--verbose", is_flag=True, help="Log what lite does (to stderr).")
def cli(verbose):
    """lite: run GGUF language models on NVIDIA GPUs (CuPy + Numba) or on the CPU (NumPy).

    \b
    lite run -p "Why is the sky blue?"          default model (SmolLM2-135M-Instruct), fetched once
    lite run -m model.gguf -p "..." --chat      any GGUF file, with its chat template
    lite info model.gguf --tensors              what is in a file
    lite bench model.gguf -p 512 -n 64          prefill and decode speed
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="lite: %(levelname)s: %(message)s")


@cli.command()
@click.option("-m", "--model", default=None,
              help="GGUF file, or a known model: smollm2 (default), gemma3.")
@click.option("-p", "--prompt", default=None, help="Prompt text; '-' reads standard input.")
@click.option("-f", "--file", "prompt_file", type=click.Path(dir_okay=False), default=None,
              help="Read the prompt from a file.")
@click.option("-n", "--n-predict", default=256, type=int, callback=_positive, show_default=True,
              help="Tokens to generate at most (stops earlier at an end-of-turn token).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the model's chat template as a user turn.")
@click.option("-s", "--system", default=None, help="System message for --chat.")
@sampling_options
@model_options
def run(model, prompt, prompt_file, n_predict, chat, system, sampling, **engine_opts):
    """Generate text from a prompt, streamed to standard output."""
    from lite.api import LLM
    if prompt_file:
        try:
            prompt = open(prompt_file, encoding="utf-8").read()
        except OSError as e:
            raise LiteError(f"cannot read prompt file {prompt_file}: {e.strerror}") from None
    elif prompt == "-":
        prompt = sys.stdin.read()
    if prompt is None:
        raise click.UsageError("give a prompt with -p TEXT or -f FILE")
    llm = LLM(model, **engine_kwargs(**engine_opts))
    if chat:
        msgs = ([{"role": "system", "content": system}] if system else [])
        prompt = llm.chat_prompt(msgs + [{"role": "user", "content": prompt}])
    else:
        sys.stdout.write(prompt)
    for piece in llm.stream(prompt, max_tokens=n_predict, **sampling):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    s = llm.last_stats
    click.echo(f"lite: {llm.device}: prompt {s.prompt_tokens} tokens ({s.reused_tokens} cached), "
               f"{s.prefill_tps:.1f} tok/s; generated {s.generated} tokens, {s.decode_tps:.1f} tok/s",
               err=True)


@cli.command()
@click.option("-m", "--model", default=None,
              help="GGUF file, or a known model: smollm2 (default), gemma3.")
@click.option("-s", "--system", default=None, help="System message.")
@click.option("-n", "--n-predict", default=512, type=int, callback=_positive, show_default=True,
              help="Tokens to generate at most per answer.")
@sampling_options
@model_options
def chat(model, system, n_predict, sampling, **engine_opts):
    """Talk with the model: one message a line on standard input, answers streamed back.

    Each turn renders the whole conversation with the model's chat template; the KV of the turns
    already seen is reused, so only the new message is prefilled. /exit or end of input quits."""
    from lite.api import LLM
    llm = LLM(model, **engine_kwargs(**engine_opts))
    msgs = [{"role": "system", "content": system}] if system else []
    tty = sys.stdin.isatty()
    while True:
        if tty:
            click.echo("> ", nl=False, err=True)
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            break
        if not line.strip():
            continue
        msgs.append({"role": "user", "content": line.rstrip("\n")})
        answer = []
        for piece in llm.stream(llm.chat_prompt(msgs), max_tokens=n_predict, **sampling):
            answer.append(piece)
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        msgs.append({"role": "assistant", "content": "".join(answer)})
        s = llm.last_stats
        logging.getLogger("lite.chat").info("turn: %d prompt tokens (%d reused), %d generated",
                                            s.prompt_tokens, s.reused_tokens, s.generated)


@cli.command()
@click.argument("model")
@click.option("--tensors", is_flag=True, help="List every tensor.")
def info(model, tensors):
    """Architecture, size, quant mix and context length of a GGUF file."""
    from lite.info import describe
    from lite.hub import resolve_model
    click.echo(describe(resolve_model(model), tensors))


@cli.command()
@click.argument("target")
@click.option("-p", "--n-prompt", default="512", show_default=True,
              help="Prompt lengths, comma-separated.")
@click.option("-n", "--n-gen", default=64, type=int, show_default=True, help="Tokens to decode.")
@click.option("-r", "--repetitions", default=3, type=int, callback=_positive, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON rows instead of a table.")
@click.option("--timeline", default=None, metavar="TRACE.json",
              help="Print the stage timeline of the last prefill and write it as a Chrome trace.")
@click.option("--verbose", "show_counters", is_flag=True,
              help="Also print the expert cache's counters (experts off the GPU).")
@click.option("--types", default=None, metavar="T1,T2",
              help="With `kernels`: the quant types to time, e.g. Q4_K,IQ3_XXS,IQ3_XXS_G4 (default: all).")
@model_options
def bench(target, n_prompt, n_gen, repetitions, as_json, timeline, show_counters, types, **engine_opts):
    """Measure prefill and decode speed of MODEL (or `lite bench kernels`: GPU kernel bandwidth)."""
    import json
    if target == "kernels":
        from lite.backends import cuda_unavailable_reason
        from lite.errors import DeviceError, UnsupportedQuantError
        from lite.kernels import dequant_types, quant_info
        from lite.kernels.bench import bench_kernels, format_table
        names = None if types is None else [quant_info(t.strip()).name for t in types.split(",") if t.strip()]
        missing = [n for n in names or () if n not in dequant_types()]
        if missing:
            raise UnsupportedQuantError(f"no GPU kernels for {', '.join(missing)} (have {', '.join(dequant_types())})")
        why = cuda_unavailable_reason()
        if why is not None:
            raise DeviceError(f"`lite bench kernels` times the GPU kernels and needs a CUDA GPU: {why}")
        rows = bench_kernels(names)
        click.echo(json.dumps(rows, indent=1) if as_json else format_table(rows))
        return
    if types is not None:
        raise click.BadParameter("--types goes with `lite bench kernels`", param_hint="--types")
    from lite.bench import bench_model, format_table
    from lite.hub import resolve_model
    try:
        lens = [int(x) for x in n_prompt.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated token counts, got {n_prompt!r}",
                                 param_hint="-p") from None
    if any(n <= 0 for n in lens) or n_gen < 0:
        raise click.BadParameter("prompt lengths must be positive and -n non-negative")
    chunks = engine_opts["prefill_chunk"]
    engine_opts["prefill_chunk"] = chunks if isinstance(chunks, list) else [chunks]
    rows = bench_model(resolve_model(target), lens, n_gen, repetitions, timeline=timeline,
                       counters=show_counters, **engine_kwargs(**engine_opts))
    click.echo(json.dumps(rows, indent=1) if as_json else format_table(rows))


from lite.cli.calibrate import calibrate  # noqa: E402
from lite.cli.serve import serve_command  # noqa: E402
from lite.cli.synth import synth  # noqa: E402

cli.add_command(synth)
cli.add_command(calibrate)
cli.add_command(serve_command(model_options, engine_kwargs))


def main(argv=None):
    """Entry point: run the click group, turning every failure into one line on stderr."""
    debug = bool(os.environ.get("LITE_DEBUG"))
    try:
        rc = cli.main(args=argv, prog_name="lite", standalone_mode=False)
        return rc if isinstance(rc, int) else 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        msg = e.format_message().replace("\n", " ")
        hint = f" (see: lite {e.ctx.info_name} --help)" if getattr(e, "ctx", None) and e.ctx.parent else ""
        click.echo(f"lite: error: {msg}{hint}", err=True)
        return e.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("lite: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except LiteError as e:
        if debug:
            raise
        click.echo(f"lite: error: {e}", err=True)
        return 1
    except MemoryError:
        if debug:
            raise
        click.echo("lite: error: out of host memory (try a smaller -c/--max-context or --kv int8)",
                   err=True)
        return 1
    except Exception as e:  # a bug: still one line, with a way to see more
        if debug:
            raise
        click.echo(f"lite: internal error: {type(e).__name__}: {e} "
                   f"(run with LITE_DEBUG=1 for the traceback)", err=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
