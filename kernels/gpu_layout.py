"""Which layout a weight takes on the GPU: the one place that decides it.

A GGUF tensor keeps its file's blocks, except an IQ3_XXS matrix, which the GPU backend repacks after
loading into a layout its decode products read faster:
  IQ3_XXS_B16 (kernels/iq3_b16.py): bands of 16 rows made for the int8 tensor-core product
              (kernels/matvec_mma.py); rows a multiple of 16, cols of 256;
  IQ3_XXS_G4  (kernels/iq3_groups.py): a row's blocks by fours for the integer-dot product
              (kernels/matvec_q8.py); cols a multiple of 1024; also where rows are looked up by
              index (the token embedding) or a fused group's member would cut a band.
Both need IQ3_XXS on the integer-dot kernels (BackendConfig.int8_dot_types) and the CUDA C kernels
(not the reference ones). BackendConfig.iq3_layout: "bands16" (the default: B16 where it fits,
else G4), "groups4" (G4 only) or "file" (the file's blocks).
"""
from lite.kernels import iq3_b16, iq3_groups
from lite.kernels.matvec_cuda import INT8_DOT_TYPES

IQ3_LAYOUTS = ("bands16", "groups4", "file")
REPACKERS = {iq3_b16.NAME: iq3_b16, iq3_groups.NAME: iq3_groups}   # layout -> module with repack / nbytes


def gpu_layout(qtype, shape, int8_dot_types=INT8_DOT_TYPES, iq3_layout="bands16", looked_up=False,
               reference=False, member_shapes=()):
    """The layout name a weight of GGUF type qtype and shape is stored in on the GPU: qtype itself
    (the file's blocks), IQ3_XXS_B16 or IQ3_XXS_G4. looked_up: its rows are read by index (never
    bands); member_shapes: the shapes of a fused group's members, each a byte range of the group."""
    if iq3_layout not in IQ3_LAYOUTS:
        raise ValueError(f"iq3_layout {iq3_layout!r}: expected one of {', '.join(IQ3_LAYOUTS)}")
    if (iq3_layout == "file" or not iq3_groups.regroupable(qtype, shape)
            or not iq3_groups.applies(int8_dot_types, reference)):
        return qtype
    if (iq3_layout == "bands16" and not looked_up and iq3_b16.fits(*shape)
            and all(iq3_b16.fits(*s) for s in member_shapes)):
        return iq3_b16.NAME
    return iq3_groups.NAME


def repack(layout, blocks, rows, cols):
    """The file's blocks of a rows x cols matrix in `layout` (a gpu_layout name; the same bytes where
    it is the file's)."""
    mod = REPACKERS.get(layout)
    return blocks if mod is None else mod.repack(blocks, rows, cols)


def nbytes(layout, rows, cols):
    """Bytes of a rows x cols matrix in a repacked layout."""
    return REPACKERS[layout].nbytes(rows, cols)


def interleaves_gate_up(qtype, int8_dot_types=INT8_DOT_TYPES):
    """Are a fused [gate; up] pair's rows of this type stored alternating (matvec_epilogue.interleave_rows),
    so that a gated decode CTA's gate and up rows are neighbours? For the types of the gated decode kernel:
    matvec_cuda's, and IQ3_XXS on its integer-dot structs (BackendConfig.gate_up_interleave turns it off)."""
    from lite.kernels import matvec_cuda, matvec_q8
    return qtype in matvec_cuda.CONFIG or (qtype == "IQ3_XXS" and matvec_q8.applies(qtype, int8_dot_types))


def reads_x_records(layout):
    """Does this layout's decode product read x as records quantized ahead (the norm-out launch can write
    them for the products after it: IQ3_XXS_B16's)?"""
    return layout == iq3_b16.NAME


def dequantize_matrix(blocks, layout, rows, cols, out_dtype, stream=None, out=None, reference=False):
    """A rows x cols weight in `layout` dequantized (flat, out_dtype): IQ3_XXS_B16 needs the shape
    (kernels/iq3_b16.py), the others are the registry's dequantize of whole blocks."""
    if layout == iq3_b16.NAME:
        return iq3_b16.dequantize(blocks, rows, cols, out_dtype, stream, out=out).reshape(-1)
    from lite.kernels import dequantize
    return dequantize(blocks, layout, out_dtype, stream, out=out, reference=reference)
