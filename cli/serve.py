"""`lite serve`: an OpenAI-compatible HTTP server (lite/server/).

The command is built from the model options and engine_kwargs of cli/main.py, handed in by it
(importing them from here would make the two modules import each other).
"""
import click


def _positive(ctx, param, value):
    if value <= 0:
        raise click.BadParameter(f"must be positive, got {value}")
    return value


def serve_command(model_options, engine_kwargs):
    @click.command("serve")
    @click.argument("model_arg", metavar="[MODEL]", required=False)
    @click.option("-m", "--model", default=None, help="GGUF file, or a known model: smollm2 (default), gemma3.")
    @click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
    @click.option("--port", default=8080, type=click.IntRange(0, 65535), show_default=True)
    @click.option("-np", "--parallel", "n_slots", default=4, type=int, callback=_positive, show_default=True,
                  help="Slots: requests decoded together in one batched step.")
    @click.option("--max-queue", default=128, type=int, callback=_positive, show_default=True,
                  help="Requests that may wait for a slot; past that the server answers 503.")
    @click.option("--api-key", default=None, help="Require `Authorization: Bearer KEY` on every request but /health.")
    @click.option("--alias", default=None, help="The model's name in the API (default: the file's stem).")
    @model_options
    def serve(model_arg, model, host, port, n_slots, max_queue, api_key, alias, **engine_opts):
        """Serve a model over the OpenAI API (/v1/chat/completions, /v1/completions, ...)."""
        from lite.server.launch import serve as run_server
        if model_arg and model:
            raise click.UsageError("give the model once: as MODEL or as -m")
        run_server(model_arg or model, host=host, port=port, n_slots=n_slots, api_key=api_key, alias=alias,
                   max_queue=max_queue, **engine_kwargs(**engine_opts))

    return serve
