"""LITE_MOE_FOLD=1's decode MoE launches as CUDAExperts._moe_run makes them (lite/backends/cuda_moe.py),
with the kernels replaced by recorders (the kernels themselves: test_moe_mvw_emulated.py, and
end to end on the GPU: test_cuda_backend.py): gate and up in one gated launch of moe_mvw (no z,
the activation's output `a` as out0, one grid row a token-slot), the down product reading `a` row by
row, no separate activation launch; without the switch, the launches as before."""
import types

import numpy as np
import pytest

from lite.backends.cuda_moe import CUDAExperts, _Weight
from lite.kernels import moe_cuda as mk
from lite.kernels import moe_mvw


class _Backend(CUDAExperts):
    cp = np

    def __init__(self, fold):
        self.__dict__["moe_fold"] = fold          # the cached property, as a backend would read it


@pytest.mark.parametrize("fold", [True, False])
def test_decode_moe_launches(monkeypatch, fold):
    launches = []

    def kernel(qtype, cols, act=None):
        def run(grid, block, args, shared_mem=0, stream=None):
            launches.append(dict(name=moe_mvw.name(qtype, cols, act), grid=grid, args=args))
        return run

    monkeypatch.setattr(moe_mvw, "kernel", kernel)
    monkeypatch.setattr(mk, "act", lambda g, u, out, kind: launches.append(dict(name="act", out=out)))
    monkeypatch.delenv("LITE_PDL", raising=False)
    monkeypatch.delenv("LITE_MOE_MV", raising=False)
    E, ff, n_embd, T, k = 8, 768, 2048, 1, 4
    ws = [_Weight(n, "Q4_K", (E, r, c), np.zeros(E * r * c // 256 * 144, np.uint8))
          for n, r, c in (("gate", ff, n_embd), ("up", ff, n_embd), ("down", n_embd, ff))]
    be = _Backend(fold)
    ids = np.array([[1, 3, 5, 7]], np.int32)
    plan = {"path": "pairs", "n": 1, "blk_expert": ids.reshape(-1), "blk_rows": None, "n_blocks": T * k,
            "pos": None}
    h = np.zeros((T, n_embd), np.float32)
    y = be._moe_run(plan, h, ids, ws, "silu")
    names = [x["name"] for x in launches]
    if fold:
        assert names == [moe_mvw.name("Q4_K", n_embd, "silu"), moe_mvw.name("Q4_K", ff)]
        gated, down = launches
        assert gated["grid"] == (-(-ff // moe_mvw.rows_per_cta("Q4_K", n_embd, "silu")), T * k, 1)
        a = gated["args"][5]                       # out0: the activation, (slots, ff)
        assert a.shape == (T * k, ff) and down["args"][4] is a and down["args"][13] == 1   # x_by_row
        assert gated["args"][6] == np.uint64(0)    # no out1
    else:
        assert names == [moe_mvw.name("Q4_K", n_embd), "act", moe_mvw.name("Q4_K", ff)]
        assert launches[0]["grid"][2] == 2         # gate and up by blockIdx.z
    assert y.shape == (T * k, n_embd)


@pytest.mark.parametrize("fold", [True, False])
def test_decode_router_is_one_launch(monkeypatch, fold):
    calls = []
    monkeypatch.setattr(mk, "route", lambda *a: calls.append(("route", a[-1])))
    monkeypatch.setattr(mk, "logits", lambda *a: calls.append(("logits",)))
    monkeypatch.setattr(mk, "topk", lambda *a: calls.append(("topk",)))
    be = _Backend(fold)
    be.w = {"r": types.SimpleNamespace(data=np.zeros((16, 64), np.float32))}
    be._route_counter = np.zeros(1, np.int32)

    class _Stream:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    be.stream = _Stream()
    ids, wts = be.moe_route(np.zeros((1, 64), np.float32), "r", 4, True)
    assert ids.shape == wts.shape == (1, 4)
    assert [c[0] for c in calls] == (["route"] if fold else ["logits", "topk"])
    if fold:
        assert calls[0][1] is be._route_counter
