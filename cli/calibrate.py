"""`lite calibrate MODEL`: measure the chunk-size cost model on this device and save it, so that
`--prefill auto` chooses chunks from measured constants (docs/design.md "The chunk model")."""
import json

import click

from lite.engine.kv_cache import KV_KINDS

DEFAULT_CONTEXT = 2 * 16384        # room for the largest calibration chunk twice (plan_points)


def _ints(spec, what):
    try:
        return [int(x) for x in str(spec).split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated token counts, got {spec!r}",
                                 param_hint=what) from None


@click.command("calibrate")
@click.argument("model")
@click.option("--device", default="auto", type=click.Choice(["auto", "cpu", "cuda"]),
              show_default=True, help="auto uses the GPU when one is usable, else the CPU.")
@click.option("--layer-split", default=None, metavar="auto|N0,N1,..",
              help="Stages to load the model as (the profile serves every split).")
@click.option("-c", "--max-context", default=DEFAULT_CONTEXT, show_default=True,
              type=click.IntRange(min=128), help="Positions the KV cache holds during calibration.")
@click.option("--kv", default="f16", type=click.Choice(KV_KINDS), show_default=True)
@click.option("--quick", is_flag=True, help="The short first-use calibration (a few seconds).")
@click.option("--budget", default=None, type=click.FloatRange(min=0, min_open=True),
              help="Seconds the timing grid may take (default 60; 5 with --quick).")
@click.option("--check", "check_tokens", default=8192, show_default=True,
              type=click.IntRange(min=0), help="Prefill this many tokens with the chosen chunk "
              "and compare the predicted time with the measured one; 0 skips.")
@click.option("--check-chunks", default="512,2048", show_default=True,
              help="Fixed chunk sizes to time in the check beside the chosen one.")
@click.option("--save/--no-save", default=True, show_default=True,
              help="Save the profile where --prefill auto finds it.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile and timings as JSON.")
def calibrate(model, device, layer_split, max_context, kv, quick, budget, check_tokens,
              check_chunks, save, as_json):
    """Time prefill chunks of a few sizes at two context offsets on this device, fit the
    chunk-size cost model, save it per device and model shape, and print the chunk that
    --prefill auto then picks for 2K..64K-token prompts.

    \b
    lite calibrate /tmp/8b.gguf --device cuda
    lite calibrate model.gguf --layer-split 8,8,8,8 --check 16384
    """
    from lite.chain.calibrate import (calibrate_engine, check_prediction, chosen_chunks,
                                      stage_layout)
    from lite.chain.chunking import describe_schedule, stack_time
    from lite.engine.engine import Engine
    from lite.files.hub import resolve_model
    split = None
    if layer_split not in (None, "auto"):
        counts = _ints(layer_split, "--layer-split")
        split = counts[0] if len(counts) == 1 else counts
    extra = _ints(check_chunks, "--check-chunks")
    engine = Engine(resolve_model(model), device=device, max_context=max_context, kv=kv,
                    layer_split=split)
    n_dev, k = stage_layout(engine)
    click.echo(f"lite calibrate: {engine.model_key} on {engine.device} ({len(engine.stages)} "
               f"stage(s) on {n_dev} device(s)): timing...", err=True)
    samples = []
    prof = calibrate_engine(engine, quick=quick, budget_s=budget, samples=samples)
    path = prof.save() if save else None
    layouts = [("this split", n_dev, k)] + [(f"{d} device(s)", d, 1) for d in (1, 2, 4)
                                             if (d, 1) != (n_dev, k)]
    table = {name: chosen_chunks(prof, d, kk) for name, d, kk in layouts}
    checks = []
    if check_tokens:
        n = min(check_tokens, engine.max_context)
        checks = check_prediction(engine, prof, n, extra)
    if as_json:
        click.echo(json.dumps({
            "profile": json.loads(prof.to_json()), "path": str(path) if path else None,
            "samples": samples,
            "chosen": {name: [{"prompt": P, "schedule": list(s), "predicted_s": t}
                              for P, s, t in rows] for name, rows in table.items()},
            "check": [{"tokens": n, "chunk": c, "predicted_s": p, "measured_s": m}
                      for c, p, m in checks]}, indent=1))
        return
    click.echo(f"profile {prof.device} / {prof.model_key} / experts {prof.experts}"
               f"{prof.expert_cache} / stages {prof.stages} / kv {prof.kv}"
               + (f" -> {path}" if path else " (not saved)"))
    click.echo(f"  fixed {1e3 * prof.fixed_s:.3f} ms/chunk, per token {1e6 * prof.per_token_s:.3f}"
               f" us (flat below {prof.min_gemm_chunk}), attention {1e9 * prof.attn_s:.4f} ns/"
               f"token/context token and {1e9 * prof.attn_chunk_s:.4f} ns/pair in the chunk "
               f"(on {100 * prof.attn_share:.0f}% of layers), experts {1e3 * prof.expert_s:.4f} "
               f"ms/distinct expert, per stage {1e3 * prof.stage_fixed_s:.3f} ms/chunk, hand-off "
               f"{1e9 * prof.handoff_s:.2f} ns/token, max chunk {prof.max_chunk} (memory)")
    click.echo("  chunk  context  measured ms  model ms  error")
    for c, ctx, t in (s for s in samples if s[0] != "handoff"):
        m = stack_time(c, ctx, prof)
        click.echo(f"  {c:5d}  {ctx:7d}  {1e3 * t:11.3f}  {1e3 * m:8.3f}  {100 * (m / t - 1):+5.1f}%")
    click.echo("schedule --prefill auto picks (predicted prefill seconds):")
    click.echo("  prompt  " + "  ".join(f"{name:>28s}" for name in table))
    for i, P in enumerate(r[0] for r in next(iter(table.values()))):
        cells = [f"{describe_schedule(rows[i][1])} {rows[i][2]:8.3f} s" for rows in table.values()]
        click.echo(f"  {P:6d}  " + "  ".join(f"{c:>28s}" for c in cells))
    for c, p, m in checks:
        label = describe_schedule(c) if isinstance(c, tuple) else c
        click.echo(f"check: pp{n} chunk {label}{' (auto)' if c == checks[0][0] else ''}: predicted "
                   f"{p:.3f} s, measured {m:.3f} s ({n / m:,.0f} tok/s, "
                   f"{100 * (p / m - 1):+.0f}%)")
