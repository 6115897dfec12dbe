"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""


class LiteError(Exception):
    """Base of every error lite raises on purpose (bad input, bad flags, a device that cannot fit)."""


class GGUFError(LiteError):
    """A GGUF file that cannot be read: names the file and what is wrong."""


class ConfigError(LiteError):
    """Model metadata lite cannot run (unknown architecture, missing key)."""


class ContextOverflowError(LiteError):
    """A prompt plus generation that does not fit the KV cache."""


class NonFiniteLogitsError(LiteError):
    """NaN or inf logits: the weights (or the file) are broken; generation stops."""


class UnsupportedQuantError(LiteError):
    """A quantization type with no implementation on this path."""


class DeviceError(LiteError):
    """A GPU that is missing or ran out of memory."""


class SynthError(LiteError):
    """Bad arguments to synth: unknown architecture, preset or quant type, or shapes a type cannot hold."""


class SettingError(LiteError, ValueError):
    """An environment setting (LITE_*) with a value lite does not know: names the setting and what
    it takes. A ValueError too, as it was before it had a class."""
