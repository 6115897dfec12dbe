"""Work-arounds for library versions, applied before numba.cuda is imported."""
import numpy as np


def patch_numpy_for_numba():
    # numba-cuda 0.30 calls np.row_stack, which numpy 2.5 removed (shared device notes).
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack
