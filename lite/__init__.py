"""lite: run GGUF language models on NVIDIA GPUs (CuPy + Numba CUDA) or the CPU (NumPy)."""
from lite.errors import LiteError, GGUFError, ConfigError, ContextOverflowError

__version__ = "0.1.0"


def __getattr__(name):
    # LLM pulls in the engine; import it lazily so `import lite` stays cheap for the CLI's --help.
    if name == "LLM":
        from lite.api import LLM
        return LLM
    if name == "serve":
        from lite.server.launch import serve
        return serve
    raise AttributeError(name)


__all__ = ["LLM", "serve", "LiteError", "GGUFError", "ConfigError", "ContextOverflowError"]
