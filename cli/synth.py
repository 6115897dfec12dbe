"""`lite synth`: write a random-weight GGUF file in a real model's layout (for benchmarks and tests)."""
import click

from lite.files.synth import ARCHS, PRESETS, QUANT_TYPES, get_preset, plan, synth as write_synth


def _summary(arch, preset, quant, layers=None):
    specs = plan(arch, preset, quant, layers)
    total = sum(s.nbytes for s in specs)
    types = {}
    for s in specs:
        types[s.qtype] = types.get(s.qtype, 0) + s.nbytes
    mix = ", ".join(f"{t} {b / 2**30:.2f} GiB" for t, b in sorted(types.items(), key=lambda kv: -kv[1]))
    return specs, total, mix


@click.command("synth")
@click.option("--arch", required=True, type=click.Choice(ARCHS), help="Architecture of the layout.")
@click.option("--preset", required=True, metavar="NAME",
              help="Model shape: " + "; ".join(f"{a}: {', '.join(p)}" for a, p in PRESETS.items()) + ".")
@click.option("--quant", default="Q4_K", show_default=True, metavar="TYPE",
              help="Type of the big matrices: " + ", ".join(QUANT_TYPES) + ".")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0),
              help="Seed of the random weights; the same arguments give the same file byte for byte.")
@click.option("--layers", default=None, type=click.IntRange(min=1), metavar="N",
              help="Only the preset's first N layers (a short file in a big model's layout).")
@click.option("--plan", "show_plan", is_flag=True,
              help="Print the tensor table and the file size; write nothing.")
@click.argument("out", required=False, metavar="OUT.gguf")
def synth(arch, preset, quant, seed, layers, show_plan, out):
    """Write a GGUF file with random weights in the exact layout llama.cpp's converter produces.

    \b
    lite synth --arch llama --preset 8b --quant Q4_K llama3-8b-synth.gguf
    lite synth --arch qwen3moe --preset 30b-a3b --quant Q4_K --plan
    lite synth --arch qwen3 --preset tiny --quant Q8_0 tiny.gguf

    Both lite and llama.cpp load the result (with a byte-level BPE tokenizer); speed does not
    depend on weight values, so benchmarks need no download.
    """
    get_preset(arch, preset)              # a clear error for a bad preset before anything else
    specs, total, mix = _summary(arch, preset, quant, layers)
    if show_plan:
        for s in specs:
            click.echo(f"{s.name:32s} {s.qtype:8s} {str(s.shape):24s} {s.nbytes:>14,d}")
        click.echo(f"{len(specs)} tensors, {total:,d} bytes ({total / 2**30:.2f} GiB): {mix}")
        return
    if not out:
        raise click.UsageError("give the output file name (OUT.gguf), or --plan to only print the table")
    click.echo(f"lite synth: {arch} {preset} {quant.upper()} -> {out} "
               f"({len(specs)} tensors, {total / 2**30:.2f} GiB)", err=True)
    step = max(1, (layers or get_preset(arch, preset).n_layer) // 8)

    def progress(done, n_layer, written, secs):
        if done % step == 0 or done == n_layer:
            click.echo(f"  {done}/{n_layer} layers  {written / 2**30:6.2f} GiB  {secs:6.1f} s", err=True)

    r = write_synth(arch, preset, quant, out, seed=seed, progress=progress, n_layer=layers)
    click.echo(f"lite synth: wrote {r['path']}: {r['bytes']:,d} bytes in {r['seconds']:.1f} s "
               f"({r['bytes'] / 2**30 / max(r['seconds'], 1e-9):.2f} GiB/s)", err=True)
