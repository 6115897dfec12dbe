"""The scheduler's counters as Prometheus text (exposition format 0.0.4)."""

METRICS = [  # (key in Scheduler.metrics(), name, type, help)
    ("requests", "lite_requests_total", "counter", "Requests accepted into the queue."),
    ("requests_finished", "lite_requests_finished_total", "counter", "Requests that ran to the end."),
    ("requests_cancelled", "lite_requests_cancelled_total", "counter",
     "Requests cancelled, most by a client that went away."),
    ("requests_failed", "lite_requests_failed_total", "counter", "Requests that failed in the engine."),
    ("requests_rejected", "lite_requests_rejected_total", "counter", "Requests refused: queue full."),
    ("prompt_tokens", "lite_prompt_tokens_total", "counter", "Prompt tokens of admitted requests."),
    ("prompt_tokens_cached", "lite_prompt_tokens_cached_total", "counter",
     "Prompt tokens served from the prefix cache."),
    ("generated_tokens", "lite_generated_tokens_total", "counter", "Tokens generated."),
    ("steps", "lite_steps_total", "counter", "Batched forward steps run."),
    ("slots_busy", "lite_slots_busy", "gauge", "Slots running a request."),
    ("slots_total", "lite_slots_total", "gauge", "Slots (-np)."),
    ("queue_length", "lite_queue_length", "gauge", "Requests waiting for a slot."),
    ("queue_max", "lite_queue_max", "gauge", "Requests that may wait before new ones get 503."),
    ("kv_blocks_free", "lite_kv_blocks_free", "gauge",
     "KV blocks no request holds (prefix-cached ones included: they are reused on demand)."),
    ("kv_blocks_total", "lite_kv_blocks_total", "gauge", "KV blocks in the pool."),
    ("kv_blocks_cached", "lite_kv_blocks_cached", "gauge", "KV blocks keyed in the prefix cache."),
    ("kv_block_size", "lite_kv_block_size", "gauge", "Positions per KV block."),
]


def prometheus_text(values):
    lines = []
    for key, name, kind, help_ in METRICS:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {values[key]}"]
    return "\n".join(lines) + "\n"


def parse_prometheus(text):
    """{name: value} of a plain exposition (no labels): what the tests and scripts read back."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
