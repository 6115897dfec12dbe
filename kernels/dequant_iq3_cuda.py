"""IQ3_XXS's dequantize on the GPU in CUDA C (CuPy RawModule; kernels/cuda/dequant_iq3_xxs.cu):
16-byte stores, the grid in shared memory, several times faster than the Numba kernels. The same float operations as gguf-py, so fp32 output equals it and fp16 output is its
round-to-nearest cast; dequant_iq's Numba kernels are the reference CI checks under the simulator
(and tests/test_iq3xxs_gather_emulated.py runs this text on the host).

Two layouts: IQ3_XXS as the file has it, and IQ3_XXS_G4 (kernels/iq3_groups.py: a row's blocks by
fours, each field together, the signs re-encoded whole and the scales in words of their own, 408
bytes a group of 4 blocks), which the decode products of the GPU backend read faster; the
prefill's dequantize then reads that layout too. The MoE prefill's gathered dequantize
(iq3xxs_gather_f16) reads the file's layout only (experts are never regrouped).
"""
import contextlib
import functools

import numpy as np

from lite.kernels.cuda_source import source
from lite.kernels.registry import quant_info



C_IQ3_XXS_DEQUANT = source("dequant_iq3_xxs.cuh")   # (after the half helpers and the grid)


def c_source():
    return source("dequant_iq3_xxs.cu")


@functools.lru_cache(maxsize=None)
def _module(device):
    import cupy
    mod = cupy.RawModule(code=c_source(), options=("--std=c++17",))
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    return mod, sms


GATHER_TILE = 2048      # values a block of iq3xxs_gather_f16
ALIGN = {False: 2, True: 4}     # the blocks' alignment launch() needs: the file's layout, IQ3_XXS_G4


def gather_kernel(device, reference=False):
    """(iq3xxs_gather_f16, values a block) for kernels/moe_cuda.gather_dequant; None where the
    Numba kernels serve IQ3_XXS (reference, the simulator)."""
    from lite.kernels.util import SIMULATOR
    return None if SIMULATOR or reference else (_module(device)[0].get_function("iq3xxs_gather_f16"), GATHER_TILE)


def launch(blocks, out, stream, grouped=False):
    """The CUDA C IQ3_XXS dequant (grouped: of IQ3_XXS_G4 blocks, whole groups of four); needs
    2-aligned blocks (grouped: 4-aligned, ALIGN) and a 16-aligned out."""
    import cupy
    mod, sms = _module(cupy.cuda.runtime.getDevice())
    n_groups = blocks.size // quant_info("IQ3_XXS_G4" if grouped else "IQ3_XXS").type_size * 32
    grid = max(1, min(-(-n_groups // 256), sms * 8))
    name = f"iq3xxs{'_g4' if grouped else ''}_deq_{'f16' if out.dtype == np.float16 else 'f32'}"
    with stream if stream is not None else contextlib.nullcontext():
        mod.get_function(name)((grid,), (256,), (blocks, out, np.int64(n_groups)))
