"""The `lite` command. Errors a user can act on print one line and exit non-zero, never a traceback."""
import logging
import os
import sys

import click

from lite.cli.generate import StdoutClosed, chat, quiet_stdout, run
from lite.cli.options import _positive, engine_kwargs, finite, model_options
from lite.errors import LiteError

class LiteGroup(click.Group):
    def resolve_command(self, ctx, args):
        """`lite bench serve ...` is a command of its own (its -c is the concurrency, and options it
        does not know go to lite serve), not `lite bench` of a model named serve."""
        if args[:2] == ["bench", "serve"]:
            from lite.cli.bench_serve import bench_serve
            return "bench serve", bench_serve, args[2:]
        return super().resolve_command(ctx, args)


@click.group(cls=LiteGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lite", prog_name="lite")
@click.option("-v", "--verbose", is_flag=True, help="Log what lite does (to stderr).")
def cli(verbose):
    """lite: run GGUF language models on NVIDIA GPUs (CuPy + Numba) or on the CPU (NumPy).

    \b
    lite run "Why is the sky blue?"             default model (SmolLM2-135M-Instruct), fetched once
    lite run -m model.gguf -p "..." --no-chat   any GGUF file; plain completion
    lite run -i                                 chat, a message a line
    lite info model.gguf --tensors --verify     what is in a file; are its weights finite
    lite bench model.gguf -p 512 -n 64          prefill and decode speed
    lite bench serve model.gguf -c 1,16,64      serving: TTFT, TPOT, ITL, output tok/s (or a server's URL)
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="lite: %(levelname)s: %(message)s")


@cli.command()
@click.argument("model")
@click.option("--tensors", is_flag=True, help="List every tensor.")
@click.option("--verify", is_flag=True, help="Check every tensor: finite after dequantization, "
              "sizes, the layers block_count promises, and a known model's sha256.")
def info(model, tensors, verify):
    """Architecture, size, quant mix and context length of a GGUF file."""
    from lite.files.hub import resolve_model
    from lite.files.info import describe, verify as verify_file
    path = resolve_model(model)
    click.echo(describe(path, tensors))
    if verify:
        from lite.files.gguf_file import GGUFFile
        from lite.progress import Progress
        progress = Progress(sum(t.nbytes for t in GGUFFile(path).tensors.values()), "verifying tensors")
        lines, problems = verify_file(path, progress)
        progress.close()
        click.echo("\n".join(lines + [f"problem:       {p}" for p in problems]))
        if problems:
            raise LiteError(f"{path}: {len(problems)} problem(s), the first: {problems[0]} "
                            f"(the file may be corrupted)")


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
@click.option("--config", "settings", default=None, metavar="KEY=VALUE,..",
              help="GPU backend settings to compare, e.g. pdl=off,iq3_layout=groups4 "
              "(the fields of BackendConfig: docs/configuration.md).")
@click.option("-t", "--threads", default=None, type=int, callback=_positive,
              help="CPU threads for the CPU backend's matrix products (default: the physical "
              "cores this process may run on).")
@model_options
def bench(target, n_prompt, n_gen, repetitions, as_json, timeline, show_counters, types, settings,
          threads, **engine_opts):
    """Measure prefill and decode speed of MODEL (or `lite bench kernels`: GPU kernel bandwidth;
    `lite bench serve URL|MODEL`: a server's latency and throughput, see its --help)."""
    import json
    if target == "kernels":
        from lite.backends import cuda_unavailable_reason
        from lite.errors import DeviceError, UnsupportedQuantError
        try:
            from lite.kernels import dequant_types, quant_info
            from lite.kernels.bench import bench_kernels, format_table
        except ImportError as e:          # a CPU install: no numba
            raise DeviceError(f"`lite bench kernels` times the GPU kernels and needs a CUDA GPU "
                              f"and lite's GPU extra (pip install '.[cuda]'): {e}") from None
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
    from lite.backend_config import BackendConfig
    from lite.bench import bench_model, format_table
    from lite.files.hub import resolve_model
    config = BackendConfig().with_settings(settings)    # a bad key fails before the model loads
    if threads is not None:
        from lite.api import set_cpu_threads
        set_cpu_threads(threads)
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
                       counters=show_counters, config=config, **engine_kwargs(**engine_opts))
    click.echo(json.dumps(rows, indent=1) if as_json else format_table(rows))


@cli.command("serve")
@click.argument("model_arg", metavar="[MODEL]", required=False)
@click.option("-m", "--model", default=None, help="GGUF file, or a known model: smollm2 (default), gemma3.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, type=click.IntRange(0, 65535), show_default=True)
@click.option("-np", "--parallel", "n_slots", default=4, type=int, callback=_positive, show_default=True,
              help="Slots: requests decoded together in one batched step.")
@click.option("--max-queue", default=128, type=int, callback=_positive, show_default=True,
              help="Requests that may wait for a slot; past that the server answers 503.")
@click.option("--api-key", default=None,
              help="Require `Authorization: Bearer KEY` (or `x-api-key: KEY`) on every request but /health and /.")
@click.option("--alias", default=None, help="The model's name in the API (default: the file's stem).")
@click.option("--webui/--no-webui", default=True, show_default=True,
              help="Serve the chat page at / (--no-webui: / answers 404).")
@click.option("--max-body-mb", default=4.0, type=float, callback=finite(0, low_open=True),
              show_default=True, help="Largest request body in MiB; a larger one gets 413 unread.")
@click.option("--read-timeout", default=30.0, type=float, callback=finite(0, low_open=True),
              show_default=True, metavar="SECONDS", help="A connection that sends no request head "
              "for this long (idle or half-sent), or stalls this long in its body (408), is closed.")
@click.option("--max-connections", default=512, type=int, callback=_positive, show_default=True,
              help="Open connections at most; a request on one past it gets 503.")
@click.option("--log-format", default="text", type=click.Choice(["text", "json"]), show_default=True,
              help="The server's log lines on stderr (start-up, one per request: method, route, "
              "status, tokens, ms): `lite: INFO: ...` text or one JSON object a line.")
@click.option("--config", "settings", default=None, metavar="KEY=VALUE,..",
              help="GPU backend settings, e.g. paged_flash=on (the fields of BackendConfig: "
              "docs/configuration.md).")
@model_options
def serve(model_arg, model, host, port, n_slots, max_queue, api_key, alias, webui, max_body_mb,
          read_timeout, max_connections, log_format, settings, **engine_opts):
    """Serve a model over the OpenAI API (/v1/chat/completions, /v1/completions, ...) and Anthropic's
    Messages API (/v1/messages), with a chat page at /."""
    from lite.backend_config import BackendConfig
    from lite.server.launch import serve as run_server
    if model_arg and model:
        raise click.UsageError("give the model once: as MODEL or as -m")
    config = BackendConfig().with_settings(settings)    # a bad key fails before the model loads
    run_server(model_arg or model, host=host, port=port, n_slots=n_slots, api_key=api_key, alias=alias,
               max_queue=max_queue, webui=webui, max_body_mb=max_body_mb, read_timeout=read_timeout,
               max_connections=max_connections, log_format=log_format, config=config,
               **engine_kwargs(**engine_opts))


from lite.cli.calibrate import calibrate  # noqa: E402
from lite.cli.synth import synth  # noqa: E402

cli.add_command(run)
cli.add_command(chat)
cli.add_command(synth)
cli.add_command(calibrate)


def main(argv=None):
    """Entry point: run the click group, turning every failure into one line on stderr."""
    debug = bool(os.environ.get("LITE_DEBUG"))
    try:
        rc = cli.main(args=argv, prog_name="lite", standalone_mode=False)
        return rc if isinstance(rc, int) else 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.BadParameter as e:      # a bad value: exit 1 (usage mistakes keep click's 2)
        click.echo(f"lite: error: {e.format_message()}".replace("\n", " "), err=True)
        return 1
    except click.ClickException as e:
        msg = e.format_message().replace("\n", " ")
        hint = f" (see: lite {e.ctx.info_name} --help)" if getattr(e, "ctx", None) and e.ctx.parent else ""
        click.echo(f"lite: error: {msg}{hint}", err=True)
        return e.exit_code
    except (StdoutClosed, BrokenPipeError):
        quiet_stdout()                  # the reader went away: end quietly, as `cat` does
        return 0
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("lite: interrupted", err=True)
        return 130
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
