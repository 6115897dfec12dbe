"""Which device each stage runs on (--devices) and how hidden states pass between stages
(--handoff host|p2p|auto, --handoff-stream). Pure functions, tested without a GPU."""
import logging

from lite.errors import LiteError

log = logging.getLogger(__name__)

# --- device assignment and hand-off options (--devices, --handoff, --handoff-stream) -------------

HANDOFFS = ("host", "p2p", "auto")
# The CUDA backend copies device to device (lite/backends/cuda_handoff.py); checked on the CPU
# against a fake CuPy and on two GPUs (tests/test_multi_gpu.py).
P2P_IMPLEMENTED = True


def parse_devices(spec):
    """'0,1,3' -> [0, 1, 3]; None or '' -> None (every stage on the default device)."""
    if spec is None or (isinstance(spec, str) and not spec.strip()):
        return None
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    try:
        ids = [int(str(x).strip()) for x in items]
    except ValueError:
        raise LiteError(f"--devices expects comma-separated GPU numbers, got {spec!r}") from None
    if any(i < 0 for i in ids):
        raise LiteError(f"--devices: GPU numbers start at 0, got {spec!r}")
    return ids


def assign_devices(n_stages, devices, n_available=None):
    """The device id of each stage. `devices` lists the GPUs to use: as many as stages gives one
    each, in order (repeats allowed: '0,0,1,1' puts two virtual stages on each); fewer spreads
    the stages over them in contiguous groups (4 stages on '0,1' -> 0,0,1,1). More devices than
    stages is an error: a GPU would hold no layers. None puts every stage on device 0."""
    if n_stages < 1:
        raise LiteError(f"need at least one stage, got {n_stages}")
    if not devices:
        return [0] * n_stages
    devices = [int(d) for d in devices]
    if n_available is not None:
        bad = [d for d in devices if d >= n_available]
        if bad:
            raise LiteError(f"--devices names GPU {bad[0]}, but {n_available} GPU(s) are visible "
                            f"(numbered 0..{n_available - 1})")
    if len(devices) > n_stages:
        raise LiteError(f"--devices lists {len(devices)} GPUs for {n_stages} stage(s): give "
                        f"--layer-split with at least {len(devices)} stages, or fewer devices")
    if len(devices) == n_stages:
        return devices
    return [devices[i * len(devices) // n_stages] for i in range(n_stages)]


def resolve_handoff(mode, stage_devices, backend="cuda", can_access_peer=None,
                    handoff_stream=False):
    """'host' or 'p2p' for a chain whose stages sit on `stage_devices`. auto takes p2p only where
    every pair of neighbouring stages on different GPUs can reach each other and p2p copies are
    implemented; p2p where that does not hold is an error saying why. can_access_peer(a, b) ->
    bool (cupy.cuda.runtime.deviceCanAccessPeer on the GPU), asked both ways for each pair: the
    consumer reads the producer's memory; a one-way link stays on the host path, to be safe.
    handoff_stream (a copy stream per stage, with either mode) needs GPU stages."""
    if mode not in HANDOFFS:
        raise LiteError(f"--handoff must be one of {', '.join(HANDOFFS)}, got {mode!r}")
    if handoff_stream and backend != "cuda":
        raise LiteError("--handoff-stream needs GPU stages (--device cuda): the CPU has no streams")
    if mode == "host":
        return "host"
    pairs = [(a, b) for a, b in zip(stage_devices, stage_devices[1:]) if a != b]
    why = None
    if backend != "cuda":
        why = "it needs GPU stages (--device cuda)"
    elif not pairs:
        why = "no two neighbouring stages are on different GPUs (see --devices)"
    elif can_access_peer is None:
        why = "peer access cannot be queried here"
    else:
        blocked = [(a, b) for a, b in pairs
                   if not (can_access_peer(a, b) and can_access_peer(b, a))]
        if blocked:
            why = f"GPU {blocked[0][0]} cannot reach GPU {blocked[0][1]} directly"
        elif not P2P_IMPLEMENTED:
            why = "device-to-device hand-off is not implemented in this lite yet"
    if why is None:
        return "p2p"
    if mode == "p2p":
        raise LiteError(f"--handoff p2p: {why}; use --handoff host (the default)")
    log.info("hand-off through host memory: %s", why)
    return "host"
