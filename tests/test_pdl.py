"""kernels/pdl.py (BackendConfig.pdl, programmatic dependent launch; on by default on sm_90+): the launch
structures as cuda.h lays them out, the kernel arguments as cuLaunchKernelEx takes them, and the
launch itself against a stand-in driver. The kernels' PDL code is compiled only with LT_PDL."""
import ctypes
import sys
import types

import numpy as np
import pytest

from lite.kernels import matvec_epilogue, pdl


def test_structures_match_cuda_h():
    # CUlaunchAttribute: int id, pad to 8, a 64-byte union; CUlaunchConfig: 7 uints, then the
    # stream, the attribute pointer and their count (64-bit pointers)
    assert ctypes.sizeof(pdl.LaunchAttribute) == 72 and pdl.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(pdl.LaunchConfig) == 56
    assert (pdl.LaunchConfig.hStream.offset, pdl.LaunchConfig.attrs.offset,
            pdl.LaunchConfig.numAttrs.offset) == (32, 40, 48)


def _device_array(ptr):
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))


def test_pack_passes_pointers_and_scalars_by_address():
    vals, ptrs = pdl.pack([_device_array(0x7f0012345600), np.int32(-3), np.float32(1.5), None,
                           np.int64(1 << 40), np.uint64(7), np.float64(1e6)])      # (RoPE's base)
    read = [ctypes.c_uint64, ctypes.c_int32, ctypes.c_float, ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint64,
            ctypes.c_double]
    got = [t.from_address(ptrs[i]).value for i, t in enumerate(read)]
    assert got == [0x7f0012345600, -3, 1.5, 0, 1 << 40, 7, 1e6]
    with pytest.raises(TypeError):
        pdl.pack([3])                           # a Python int: which C type is not known


def test_launch_sets_the_programmatic_attribute(monkeypatch):
    seen = {}

    def driver(cfg, func, params, extra):
        c = cfg._obj
        seen.update(grid=(c.gridDimX, c.gridDimY, c.gridDimZ), block=(c.blockDimX, c.blockDimY, c.blockDimZ),
                    stream=c.hStream, n=c.numAttrs, attr=(c.attrs[0].id, c.attrs[0].value[0]), func=func.value,
                    arg0=ctypes.c_int32.from_address(params[0]).value)
        return 0

    monkeypatch.setattr(pdl, "_driver", lambda: driver)
    pdl.launch(types.SimpleNamespace(ptr=0x1234), (5, 2), (128,), [np.int32(9)], 0xABC)
    assert seen == {"grid": (5, 2, 1), "block": (128, 1, 1), "stream": 0xABC, "n": 1,
                    "attr": (pdl.ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, 1), "func": 0x1234, "arg0": 9}
    # a RawKernel (what RawModule.get_function returns) holds the handle in its kernel's ptr
    pdl.launch(types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0x4321)), (1,), (1,), [np.int32(1)], 0)
    assert seen["func"] == 0x4321
    monkeypatch.setattr(pdl, "_driver", lambda: lambda *a: 1)
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx"):
        pdl.launch(types.SimpleNamespace(ptr=1), (1,), (1,), [], 0)


def test_kernels_take_the_pdl_code_only_when_asked(monkeypatch):
    assert "#define LT_PDL\n" not in matvec_epilogue.c_source()
    assert not pdl.resolve(False) and pdl.source_head(False) == ""
    assert pdl.resolve(None) == pdl._current_device_has_pdl()     # auto: compute capability 9.0+
    monkeypatch.setattr(pdl, "_current_device_has_pdl", lambda: False)
    assert not pdl.resolve(None) and pdl.resolve(True)
    # a GPU of compute capability 9.0 but no cuLaunchKernelEx in the driver: plain launches
    monkeypatch.undo()
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDevice=lambda: 0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(pdl, "_has_pdl", lambda device: True)
    monkeypatch.setattr(pdl, "_driver_ok", lambda: False)
    assert not pdl.resolve(None)
    monkeypatch.setattr(pdl, "_driver_ok", lambda: True)
    assert pdl.resolve(None)
    src = matvec_epilogue.c_source(pdl.source_head(True))
    assert src.startswith("#define LT_PDL") and "griddepcontrol.wait" in src
    # the wait comes before the trigger: at most two kernels resident (the other order lost)
    assert src.index("griddepcontrol.wait") < src.index("griddepcontrol.launch_dependents")


def test_call_takes_the_plain_launch_unless_enabled(monkeypatch):
    calls = []
    func = types.SimpleNamespace(ptr=0x99)
    plain = lambda grid, block, args, shared_mem=0, stream=None: calls.append(("plain", grid, shared_mem))
    pdl.call(lambda *a, **k: plain(*a, **k), (3,), (64,), (), stream=None, shared_mem=128, pdl=False)
    assert calls == [("plain", (3,), 128)] and pdl.source_head(False) == ""
    monkeypatch.setattr(pdl, "launch", lambda f, g, b, a, s, shared_mem=0: calls.append(("pdl", g, shared_mem, s)))
    pdl.call(func, (3,), (64,), (), stream=types.SimpleNamespace(ptr=0x55), shared_mem=128, pdl=True)
    assert calls[-1] == ("pdl", (3,), 128, 0x55) and pdl.source_head(True) == "#define LT_PDL\n"


def test_decode_kernels_open_with_the_prologue():
    """Every decode attention kernel (the default, the tiled one for the head dims it lacks,
    RoPE + KV store) starts with PDL_PROLOGUE, which is empty unless LT_PDL: a PDL launch of them
    never reads the previous kernel's output early."""
    from lite.kernels.cuda_source import source
    for name in ("decode_attention.cu", "decode_attention_tiled.cu", "rope_kv_store.cu"):
        src = source(name)
        assert src.count('extern "C" __global__') == 2 == src.count("{ PDL_PROLOGUE(); ")
        assert "#define PDL_PROLOGUE() do { } while (0)" in src
