"""`lite bench serve URL|MODEL`: serving latency and throughput (lite/bench_serve.py)."""
import json

import click

from lite.cli.options import _positive


def _counts(ctx, param, value):
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or any(n <= 0 for n in out):
        raise click.BadParameter(f"expected positive comma-separated counts, got {value!r}")
    return out


def _model_vocab(model):
    """The model file's vocabulary size (prompt ids must be below it)."""
    from lite.files.config import ModelConfig
    from lite.files.gguf_file import GGUFFile
    from lite.files.hub import resolve_model
    g = GGUFFile(resolve_model(model))
    return ModelConfig.from_gguf(g.metadata, g.path).n_vocab


@click.command("bench serve", context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                                "help_option_names": ["-h", "--help"]})
@click.argument("target", metavar="URL|MODEL")
@click.option("-c", "--concurrency", default="1,16,64", callback=_counts, show_default=True,
              help="Requests in flight at once, one row each (comma-separated).")
@click.option("--prompt-len", default=512, type=int, callback=_positive, show_default=True,
              help="Prompt length in tokens (random token ids).")
@click.option("--gen", default=128, type=int, callback=_positive, show_default=True,
              help="Tokens generated per request.")
@click.option("--requests", default=None, type=int, callback=_positive,
              help="Requests per concurrency level (default: 4 x the level, at least 8).")
@click.option("--vocab", default=None, type=int, callback=_positive,
              help="Prompt ids are drawn below this (default 32000, or the model's vocabulary if smaller).")
@click.option("--seed", default=0, type=int, show_default=True, help="Seed of the random prompts.")
@click.option("--no-warmup", is_flag=True, help="Skip the uncounted warm-up round before each level.")
@click.option("--api-key", default=None, help="Sent as `Authorization: Bearer KEY` (a URL's server).")
@click.option("--timeout", default=600.0, type=float, show_default=True, help="Seconds per request.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON rows instead of a table.")
@click.pass_context
def bench_serve(ctx, target, concurrency, prompt_len, gen, requests, vocab, seed, no_warmup, api_key,
                timeout, as_json):
    """Serving benchmark, vLLM's method: distinct random prompts as token ids, streamed
    /v1/completions at temperature 0; TTFT, TPOT and ITL (median, p99) and output tokens per second
    at each concurrency.

    \b
    URL:   any OpenAI-compatible server (lite serve, llama-server), e.g. http://127.0.0.1:8080
    MODEL: a GGUF file or known model; `lite serve` is started on a free local port and stopped
           after. Options not listed here go to it (e.g. --device cuda -np 64 --ctx-size 4096; -np
           defaults to the largest concurrency).
    """
    from lite.bench_serve import DEFAULT_VOCAB, Client, LiteServer, bench_serve as run, format_table
    extra = list(ctx.args)
    def progress(row):
        click.echo(f"lite bench serve: concurrency {row['concurrency']} done, "
                   f"{row['output_tok_s']:.1f} output tok/s", err=True)

    def go(url):
        rows = run(Client(url, api_key, timeout), concurrency, prompt_len, gen, requests, vocab, seed,
                   not no_warmup, progress)
        click.echo(json.dumps(rows, indent=1) if as_json else format_table(rows))

    if target.startswith(("http://", "https://")):
        if extra:
            raise click.UsageError(f"{' '.join(extra)}: options for lite serve, but the target is a URL")
        return go(target)
    if not any(a in ("-np", "--parallel") or a.startswith("--parallel=") for a in extra):
        extra += ["-np", str(max(concurrency))]
    vocab = vocab or min(DEFAULT_VOCAB, _model_vocab(target))
    with LiteServer(target, extra) as server:
        go(server.url)
