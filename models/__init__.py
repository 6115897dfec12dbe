"""One module per architecture family; each has forward_layer(ops, cfg, il, x, kv, pos0)."""
from lite.models import gemma3, llama, qwen3moe, qwen3next

FAMILIES = {"llama": llama, "qwen2": llama, "qwen3": llama, "qwen3moe": qwen3moe,
            "qwen2moe": qwen3moe, "gemma3": gemma3, "qwen3next": qwen3next}


def family(arch):
    from lite.errors import ConfigError
    if arch not in FAMILIES:
        raise ConfigError(f"architecture {arch!r} has no forward yet; supported: {', '.join(FAMILIES)}")
    return FAMILIES[arch]
