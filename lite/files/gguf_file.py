"""GGUF file reading: the file is mapped into memory; metadata and the tensor table are parsed with
bounds checks, so a malformed file raises GGUFError naming the file and the fault, never an
IndexError, a MemoryError from a bogus count, or a hang.

Tensor data are zero-copy uint8 views of the mapping (`Tensor.raw`), in GGUF blocks.
"""
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from lite.errors import GGUFError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32
MAX_NESTING = 8

# value type id -> (struct format, size) for fixed-size scalars
_SCALARS = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Tensor:
    name: str
    qtype: GGMLQuantizationType
    shape: tuple          # numpy order: (..., rows, cols); GGUF stores it reversed (ne0 = cols)
    offset: int           # absolute byte offset in the file
    nbytes: int
    raw: np.ndarray       # (nbytes,) uint8 view of the mapping

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return self.qtype.name


class _Cursor:
    """Reads little-endian values from a buffer, raising GGUFError instead of running off the end."""

    def __init__(self, buf, path):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def fail(self, what):
        raise GGUFError(f"{self.path}: {what}")

    def need(self, n, what):
        if n < 0 or self.pos + n > self.size:
            self.fail(f"truncated file: {what} at byte {self.pos} needs {n} bytes, "
                      f"file has {self.size}")

    def scalar(self, vtype, what):
        fmt, size = _SCALARS[vtype]
        self.need(size, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return v

    def u32(self, what):
        return self.scalar(4, what)

    def u64(self, what):
        return self.scalar(10, what)

    def string(self, what):
        n = self.u64(f"length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} is not valid UTF-8")

    def value(self, vtype, what, depth=0):
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype = self.u32(f"item type of {what}")
            count = self.u64(f"item count of {what}")
            if itype in _SCALARS:
                size = _SCALARS[itype][1]
                self.need(count * size, what)  # checked before allocating anything
                arr = np.frombuffer(self.buf, dtype=_NUMPY[itype], count=count, offset=self.pos).copy()
                self.pos += count * size
                return arr
            if itype == _STRING:
                self.need(count * 8, what)  # every string needs at least its 8-byte length
                return [self.string(f"{what}[{i}]") for i in range(count)]
            if itype == _ARRAY:
                if depth >= MAX_NESTING:
                    self.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
                self.need(count * 12, what)
                return [self.value(_ARRAY, f"{what}[{i}]", depth + 1) for i in range(count)]
            self.fail(f"{what} has unknown array item type {itype}")
        self.fail(f"{what} has unknown value type {vtype}")


class GGUFFile:
    """A mapped GGUF file: `.metadata` (dict), `.tensors` (dict name -> Tensor), `.path`."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise GGUFError(f"{self.path}: no such file")
        if os.path.isdir(self.path):
            raise GGUFError(f"{self.path}: is a directory, not a GGUF file")
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise GGUFError(f"{self.path}: empty file, not a GGUF file")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot read: {e.strerror}") from None
        self._parse(memoryview(self._map))

    def _parse(self, buf):
        c = _Cursor(buf, self.path)
        c.need(4, "magic")
        if bytes(buf[:4]) != GGUF_MAGIC:
            c.fail("not a GGUF file (bad magic)")
        c.pos = 4
        self.version = c.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            c.fail(f"unsupported GGUF version {self.version} (supported: 2, 3)")
        n_tensors = c.u64("tensor count")
        n_kv = c.u64("metadata count")
        # Each entry needs at least ~13 bytes, so a bogus count fails here instead of looping for ages.
        c.need(n_kv * 13 + n_tensors * 24, "metadata and tensor table")

        self.metadata = {}
        for i in range(n_kv):
            key = c.string(f"metadata key {i}")
            vtype = c.u32(f"type of {key!r}")
            self.metadata[key] = c.value(vtype, f"metadata {key!r}")

        align = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1) or align > 1 << 20:
            c.fail(f"general.alignment {align!r} is not a power of two")
        self.alignment = align

        infos = []
        for i in range(n_tensors):
            name = c.string(f"name of tensor {i}")
            n_dims = c.u32(f"dimension count of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                c.fail(f"tensor {name!r} has {n_dims} dimensions (1..{MAX_DIMS} allowed)")
            dims = [c.u64(f"dimension of {name!r}") for _ in range(n_dims)]
            type_id = c.u32(f"type of {name!r}")
            offset = c.u64(f"offset of {name!r}")
            infos.append((name, dims, type_id, offset))

        data_start = -(-c.pos // align) * align
        file_size = len(buf)
        self.tensors = {}
        for name, dims, type_id, offset in infos:
            if name in self.tensors:
                c.fail(f"tensor {name!r} appears twice")
            try:
                qtype = GGMLQuantizationType(type_id)
                block_elems, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                c.fail(f"tensor {name!r} has unknown type id {type_id}")
            n = 1
            for d in dims:
                n *= d
            if n >= 1 << 62:
                c.fail(f"tensor {name!r} has sizes that overflow ({dims})")
            if dims[0] % block_elems:
                c.fail(f"tensor {name!r}: row of {dims[0]} values is not a whole number of "
                       f"{qtype.name} blocks of {block_elems}")
            nbytes = n // block_elems * type_size
            if offset % align:
                c.fail(f"tensor {name!r} offset {offset} is not aligned to {align}")
            start = data_start + offset
            if start + nbytes > file_size:
                c.fail(f"truncated file: tensor {name!r} ends at byte {start + nbytes}, "
                       f"past the end of the file ({file_size} bytes)")
            raw = np.frombuffer(buf, dtype=np.uint8, count=nbytes, offset=start)
            self.tensors[name] = Tensor(name, qtype, tuple(int(d) for d in reversed(dims)),
                                        start, nbytes, raw)

    @property
    def architecture(self) -> str:
        return self.metadata.get("general.architecture", "")

    def close(self):
        # Views of the mapping may still be alive; leave the map to the garbage collector then.
        self.tensors = {}

    def __repr__(self):
        return f"GGUFFile({self.path!r}, {len(self.tensors)} tensors)"
