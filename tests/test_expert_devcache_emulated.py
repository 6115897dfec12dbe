"""expert_cache_step and expert_cache_fetch (kernels/expert_cache.py), their CUDA C run on the host through
tests/cuda_c_emulator.py, against step_ref (the NumPy twin the CPU tests drive the cache with)."""
import numpy as np
import pytest

import cuda_c_emulator as emu

from lite.kernels import expert_cache as xd

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs g++ (C++20)")

SHIMS = r"""
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline unsigned __ballot_sync(unsigned, bool p) {
    int lane = threadIdx.x & 31;
    tl_warp->buf[lane] = p ? 1ull : 0ull;
    tl_warp->bar->arrive_and_wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (unsigned)tl_warp->buf[i] << i;
    tl_warp->bar->arrive_and_wait();
    return r;
}
static std::atomic<int> emu_stc{0};
inline int __syncthreads_count(int p) {
    __syncthreads();
    if (p) emu_stc.fetch_add(1);
    __syncthreads();
    int r = emu_stc.load();
    __syncthreads();
    if (threadIdx.x == 0) emu_stc.store(0);
    __syncthreads();
    return r;
}
"""
WRAP = r"""
extern "C" __global__ void emu_fetch(const int* fetch, const unsigned char* src0, const unsigned char* src1,
        const unsigned char* src2, long long eb0, long long eb1, long long eb2,
        unsigned char* dst0, unsigned char* dst1, unsigned char* dst2) {
    blockIdx.z = blockIdx.y % 3; blockIdx.y /= 3;
    expert_cache_fetch(fetch, src0, src1, src2, eb0, eb1, eb2, dst0, dst1, dst2);
}
"""


@pytest.fixture(scope="module")
def lib():
    return emu.compile_kernels(SHIMS + xd.C_XC + WRAP)


def test_step_and_fetch_match_the_twin(lib):
    n_expert, rows, n_dev, max_ids = 40, 3, 12, 8
    ebytes = [64, 64, 40]                 # 40: not a multiple of 16, the byte loop
    rng = np.random.default_rng(5)
    src = [[rng.integers(0, 256, n_expert * eb, dtype=np.uint8) for eb in ebytes] for _ in range(rows)]
    dst = [np.zeros(n_dev * eb, np.uint8) for eb in ebytes]
    got = {"table": np.full((rows, n_expert), -1, np.int32), "key": np.full(n_dev, -1, np.int32),
           "stamp": np.full(n_dev, -1, np.int32), "clock": np.zeros(1, np.int32),
           "fetch": np.zeros(1 + 2 * max_ids, np.int32), "counters": np.zeros(3, np.uint64)}
    want = {k: v.copy() for k, v in got.items()}
    for step in range(30):
        row = step % rows
        T = int(rng.integers(1, 5))
        ids = np.stack([rng.choice(10 if step % 3 else n_expert, 2, replace=False)
                        for _ in range(T)]).astype(np.int32)
        lib.launch("expert_cache_step", (1,), (xd.STEP_THREADS,), ids, np.int32(ids.size), np.int32(row),
                   np.int32(n_expert),
                   got["table"], got["key"], got["stamp"], got["clock"], np.int32(n_dev), got["fetch"],
                   got["counters"])
        xd.step_ref(ids, row, n_expert, want["table"], want["key"], want["stamp"], want["clock"], want["fetch"],
                    want["counters"])
        for k in ("table", "key", "stamp", "clock", "counters"):
            assert np.array_equal(got[k], want[k]), (step, k)
        n = int(want["fetch"][0])
        assert np.array_equal(got["fetch"][:1 + 2 * n], want["fetch"][:1 + 2 * n]), step
        lib.launch("emu_fetch", (2, 3 * ids.size), (32,), got["fetch"], *src[row],
                   *[np.int64(eb) for eb in ebytes], *dst)
        for e in np.unique(ids):
            s = int(want["table"][row, e])
            for k, eb in enumerate(ebytes):
                assert np.array_equal(dst[k][s * eb:(s + 1) * eb], src[row][k][e * eb:(e + 1) * eb]), (step, e, k)
    assert want["counters"][1] > n_dev                  # evictions happened
