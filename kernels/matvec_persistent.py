"""The persistent register kernel `matvec_persistent`: matvec_cuda's register loop on a grid of as many CTAs as
fit the device at once, each walking row groups blockIdx.x, +gridDim.x, ... and loading the next
item (row group, trip) into registers before computing this one, across row groups too.

IQ3_XXS's decode product where x is not quantized (kernels/matvec_iq.py: TIQ3_XXS, 8 rows a CTA,
faster than its register kernel mv_iq3xxs there); the K types' register kernel `matvec_rows` beat it.
"""
import functools

from lite.kernels.cuda_source import source

THREADS = 128

C_PERSISTENT = source("matvec_persistent.cuh")


def persistent_name(struct, n, rows_per_cta):
    return f"matvec_persistent<{struct}, {n}, {rows_per_cta}>"


def _blocks_per_sm(func, smem, device):
    import cupy
    try:
        return max(1, cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(func.ptr, THREADS, smem))
    except Exception:   # noqa: BLE001 - no such call in this CuPy: registers and shared memory bound it
        props = cupy.cuda.runtime.getDeviceProperties(device)
        by_smem = props.get("sharedMemPerMultiprocessor", 233472) // (smem + func.shared_size_bytes + 1024)
        regs = -(-func.num_regs * 32 // 256) * 256 * (THREADS // 32)
        return max(1, min(by_smem, 65536 // max(regs, 1), 2048 // THREADS))


@functools.lru_cache(maxsize=None)
def prepare(func, smem, device):
    """Allows `func` its dynamic shared memory; returns the persistent grid's size cap (CTAs that
    fit on the device at once)."""
    import cupy
    if smem > 48 * 1024:
        func.max_dynamic_shared_size_bytes = smem
    if smem:   # ask for the largest shared-memory carveout, or fewer CTAs than computed may fit
        func.preferred_shared_memory_carveout = 100
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    return sms * _blocks_per_sm(func, smem, device)


def launch(func, smem, device, rows, rows_per_cta, args):
    """Enqueue one persistent kernel on the current CuPy stream (smem: its dynamic shared memory)."""
    cap = prepare(func, smem, device)
    grid = max(1, min(-(-rows // rows_per_cta), cap))
    func((grid,), (THREADS,), args, shared_mem=smem)
