"""The chunk-size cost model's calibrated constants (`CostProfile`) and what they are keyed by
(`ProfileKey`): saved per key under the cache directory, so that a profile measured with one
expert placement, cache size, stage layout or KV type is never used for another
(docs/design.md "The chunk model"; the model itself is in lite/chain/chunking.py)."""
import json
import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from lite.errors import LiteError

# 2: expert-traffic and in-chunk attention terms, the attention share, keyed by placement,
# cache, stages and KV; a version-1 file is recalibrated, never read with the new meaning.
PROFILE_VERSION = 2
MEMORY_CHUNK_LIMIT = 1 << 16   # the default cap when nothing better is known: memory decides


class ProfileError(LiteError):
    """A saved cost profile that cannot be read."""


@dataclass(frozen=True)
class ProfileKey:
    """Everything that changes the cost model's terms: a profile is measured for one of these.

    experts: where the expert tensors live ("none" for a dense model, "gpu", "host", "mmap");
    expert_cache: the GPU expert cache as a whole percent of the expert bytes ("" with experts on
    the GPU); stages: "<devices>x<stages per device>"; kv: the KV cache type."""
    model_key: str
    device: str
    experts: str = "none"
    expert_cache: str = ""
    stages: str = "1x1"
    kv: str = "f16"

    def file_name(self):
        safe = lambda s: re.sub(r"[^A-Za-z0-9._-]+", "_", str(s)).strip("_") or "any"  # noqa: E731
        parts = [self.device, self.model_key, f"experts-{self.experts}{self.expert_cache}",
                 f"stages-{self.stages}", f"kv-{self.kv}"]
        return "__".join(safe(p) for p in parts) + ".json"


KEY_FIELDS = tuple(f.name for f in fields(ProfileKey))


@dataclass
class CostProfile:
    """Calibrated constants (seconds) for one ProfileKey; the terms are described in
    lite/chain/chunking.py. The whole-stack terms are for the full layer stack on one device."""
    fixed_s: float = 0.01              # per chunk, whole layer stack (split among stages)
    per_token_s: float = 1e-4          # per token, whole layer stack
    attn_s: float = 2.5e-9             # per token per context token before the chunk
    attn_chunk_s: float = 2.5e-9       # per causal token pair inside the chunk (c(c+1)/2 pairs)
    attn_share: float = 1.0            # share of layers with full attention (hybrid, sliding)
    expert_s: float = 0.0              # per distinct expert a chunk touches in one MoE layer
    expert_overlap: float = 0.0        # share of the shorter of expert copy and compute hidden
    n_expert: int = 0                  # experts per MoE layer (0: dense)
    expert_top_k: int = 0              # experts each token is routed to
    expert_curve: tuple = ()           # measured ((chunk, distinct experts), ...); else the formula
    stage_fixed_s: float = 2e-4        # per chunk per stage, whatever its layer count
    handoff_s: float = 5e-7            # per token, out of one stage and into the next
    min_gemm_chunk: int = 256          # below this many tokens a chunk costs as much as this many
    max_chunk: int = MEMORY_CHUNK_LIMIT  # largest chunk that fits memory (the engine sets it)
    model_key: str = ""
    device: str = ""
    experts: str = "none"
    expert_cache: str = ""
    stages: str = "1x1"
    kv: str = "f16"
    version: int = PROFILE_VERSION

    def __post_init__(self):
        for name in ("fixed_s", "per_token_s", "attn_s", "attn_chunk_s", "attn_share",
                     "expert_s", "expert_overlap", "stage_fixed_s", "handoff_s"):
            try:
                v = float(getattr(self, name))
            except (TypeError, ValueError):
                raise ProfileError(f"cost profile field {name} must be a number, "
                                   f"got {getattr(self, name)!r}") from None
            if not math.isfinite(v) or v < 0:
                raise ProfileError(f"cost profile field {name} must be a finite number >= 0, "
                                   f"got {v!r}")
            setattr(self, name, v)
        if self.attn_share > 1 or self.expert_overlap > 1:
            raise ProfileError(f"cost profile attn_share and expert_overlap are shares, got "
                               f"{self.attn_share} and {self.expert_overlap}")
        for name in ("min_gemm_chunk", "max_chunk", "n_expert", "expert_top_k"):
            setattr(self, name, int(getattr(self, name)))
        if self.min_gemm_chunk < 1 or self.max_chunk < 1:
            raise ProfileError("cost profile min_gemm_chunk and max_chunk must be >= 1")
        if self.n_expert < 0 or not 0 <= self.expert_top_k <= max(self.n_expert, 0):
            raise ProfileError(f"cost profile expert_top_k {self.expert_top_k} must be within "
                               f"0..n_expert ({self.n_expert})")
        try:
            self.expert_curve = tuple(sorted((int(c), float(d)) for c, d in self.expert_curve))
        except (TypeError, ValueError):
            raise ProfileError(f"cost profile expert_curve must be (chunk, distinct) pairs, "
                               f"got {self.expert_curve!r}") from None

    @property
    def key(self):
        return ProfileKey(**{k: getattr(self, k) for k in KEY_FIELDS})

    def with_key(self, key):
        """This profile's constants under another key (a copy)."""
        return CostProfile(**{**asdict(self), **asdict(key)})

    def to_json(self):
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text):
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ProfileError(f"cost profile is not JSON: {e}") from e
        if not isinstance(data, dict):
            raise ProfileError("cost profile must be a JSON object")
        if data.get("version") != PROFILE_VERSION:
            raise ProfileError(f"cost profile version {data.get('version')!r}, this lite "
                               f"reads version {PROFILE_VERSION}: calibrate again")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except (TypeError, ValueError) as e:
            raise ProfileError(f"bad cost profile: {e}") from e

    def save(self, root=None):
        path = profile_path(self.key, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)   # atomic: a concurrent reader never sees half a file
        return path

    @classmethod
    def load(cls, key, root=None, stale_ok=True):
        """The saved profile for this key, or None when there is none. A file of another profile
        version is stale: None (so the caller calibrates again and overwrites it) when stale_ok,
        else a ProfileError; any other unreadable file is a ProfileError."""
        path = profile_path(key, root)
        if not path.exists():
            return None
        text = path.read_text()
        try:
            prof = cls.from_json(text)
        except ProfileError as e:
            if stale_ok and _version_of(text) not in (None, PROFILE_VERSION):
                return None
            raise ProfileError(f"{path}: {e}") from e
        if prof.key != key:
            raise ProfileError(f"{path}: holds the profile of {prof.key}, not of {key}")
        return prof


def _version_of(text):
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data.get("version") if isinstance(data, dict) else None


def profile_dir(root=None):
    if root is not None:
        return Path(root)
    from lite.files.hub import cache_dir
    return cache_dir() / "profiles"


def profile_path(key, root=None):
    return profile_dir(root) / key.file_name()
