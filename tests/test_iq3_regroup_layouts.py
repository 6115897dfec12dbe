"""lite/backends/cuda.py `_regroup_iq3` with kernels/gpu_layout.py's choice of layout, run on the host over NumPy
blocks (the repacks take NumPy or CuPy): with iq3_layout="groups4" every 2-D IQ3_XXS matrix becomes IQ3_XXS_G4,
with "file" none is repacked; by default ("bands16") those of
whole bands of 16 rows become IQ3_XXS_B16, token_embd (looked up by rows) and a group with a member of ragged rows
stay G4, and a fused group's members are byte ranges of its records that hold their own rows."""
import numpy as np
import pytest

from kernel_blocks import random_blocks

from lite.backend_config import BackendConfig
from lite.backends import cuda
from lite.backends.cuda_moe import _Weight
from lite.kernels import gpu_layout, iq3_b16, iq3_groups


class _Stub:                 # the attributes _regroup_iq3 reads
    def __init__(self, w, fused, iq3_layout="bands16"):
        self.w, self.fused, self.config = w, fused, BackendConfig(iq3_layout=iq3_layout, reference_kernels=False)


def _weight(name, rows, cols, rng):
    return _Weight(name, "IQ3_XXS", (rows, cols), random_blocks("IQ3_XXS", rows * cols // 256, rng).reshape(-1))


def _model(rng):
    w = {n: _weight(n, r, 1024, rng) for n, r in (("token_embd.weight", 64), ("blk.0.attn_q.weight", 32),
                                                   ("blk.0.attn_k.weight", 16), ("blk.0.ffn_down.weight", 48),
                                                   ("blk.0.attn_output.weight", 40))}
    members = ("blk.0.attn_q.weight", "blk.0.attn_k.weight")
    group = _Weight("+".join(members), "IQ3_XXS", (48, 1024),
                    np.concatenate([w[m].data for m in members]))
    for m, off in zip(members, (0, w[members[0]].data.size)):
        w[m].data = group.data[off:off + w[m].data.size]
    return w, {members: (group, [32, 16], False)}, members


@pytest.mark.parametrize("b16", [False, True], ids=["g4", "b16"])
def test_regroup_layouts(monkeypatch, b16):
    rng = np.random.default_rng(3)
    w, fused, members = _model(rng)
    before = {n: x.data.copy() for n, x in w.items()}
    monkeypatch.setattr(iq3_groups, "applies", lambda *a: True)
    cuda.CUDABackend._regroup_iq3(_Stub(w, fused, "bands16" if b16 else "groups4"))
    want = {"token_embd.weight": iq3_groups, "blk.0.attn_output.weight": iq3_groups}   # 40 rows: not whole bands
    for n in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight"):
        want[n] = iq3_b16 if b16 else iq3_groups
    for n, mod in want.items():
        x = w[n]
        assert x.qtype == mod.NAME, n
        assert np.array_equal(x.data, mod.repack(before[n], *x.shape)), n      # its own rows, repacked
    group = fused[members][0]
    assert group.qtype == want[members[0]].NAME
    assert np.array_equal(group.data, np.concatenate([w[m].data for m in members]))


def test_regroup_keeps_a_group_with_ragged_rows_in_g4(monkeypatch):
    rng = np.random.default_rng(5)
    w = {n: _weight(n, r, 1024, rng) for n, r in (("blk.0.attn_q.weight", 24), ("blk.0.attn_v.weight", 8))}
    members = tuple(w)       # 32 rows together (whole bands), but the members' byte ranges would cut a band
    group = _Weight("+".join(members), "IQ3_XXS", (32, 1024), np.concatenate([w[m].data for m in members]))
    fused = {members: (group, [24, 8], False)}
    monkeypatch.setattr(iq3_groups, "applies", lambda *a: True)
    cuda.CUDABackend._regroup_iq3(_Stub(w, fused))
    assert group.qtype == iq3_groups.NAME and all(w[m].qtype == iq3_groups.NAME for m in members)


def test_file_layout_repacks_nothing(monkeypatch):
    rng = np.random.default_rng(4)
    w, fused, members = _model(rng)
    before = {n: x.data.copy() for n, x in w.items()}
    monkeypatch.setattr(iq3_groups, "applies", lambda *a: True)
    cuda.CUDABackend._regroup_iq3(_Stub(w, fused, "file"))
    assert all(x.qtype == "IQ3_XXS" and np.array_equal(x.data, before[n]) for n, x in w.items())


def test_gpu_layout_choice():
    """One function chooses (kernels/gpu_layout.py): the CUDA C kernels with IQ3_XXS on dp4a are needed."""
    on = dict(reference=False)
    assert gpu_layout.gpu_layout("Q4_K", (4096, 4096), **on) == "Q4_K"
    if iq3_groups.applies():           # (a GPU's CUDA C kernels; in the simulator never)
        assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), **on) == iq3_b16.NAME
        assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), looked_up=True, **on) == iq3_groups.NAME
        assert gpu_layout.gpu_layout("IQ3_XXS", (40, 4096), **on) == iq3_groups.NAME
        assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), iq3_layout="groups4", **on) == iq3_groups.NAME
    assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), iq3_layout="file") == "IQ3_XXS"
    assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), int8_dot_types=("Q4_K",)) == "IQ3_XXS"
    assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), reference=True) == "IQ3_XXS"
    assert gpu_layout.gpu_layout("IQ3_XXS", (4096, 768)) == "IQ3_XXS"           # not whole groups
    with pytest.raises(ValueError, match="iq3_layout"):
        gpu_layout.gpu_layout("IQ3_XXS", (4096, 4096), iq3_layout="b16")


def test_interleave_and_x_records_choices():
    assert gpu_layout.interleaves_gate_up("Q4_K") and gpu_layout.interleaves_gate_up("Q6_K", ())
    assert gpu_layout.interleaves_gate_up("IQ3_XXS") and not gpu_layout.interleaves_gate_up("IQ3_XXS", ("Q4_K",))
    assert not gpu_layout.interleaves_gate_up("IQ4_XS")
    assert gpu_layout.reads_x_records(iq3_b16.NAME) and not gpu_layout.reads_x_records(iq3_groups.NAME)
