"""The .npy files of the protocol, with the standard library only.

flashcheck writes Q, K and V, and reads O and LSE, as NumPy format 1.0 files:
little-endian, C order, with the type strings '<f4' (f32), '<f2' (f16) and
'<u2' (bf16, as its 16-bit pattern: NumPy has no bfloat16). This module reads
and writes them without NumPy, so that a worker needs nothing beyond Python;
`flashcheck_worker.Request.load` offers NumPy arrays when NumPy is installed.

Rounding is to nearest even from the exact Python float (a float64), also for
bf16: going through float32 first would round twice.
"""
from __future__ import annotations

import ast
import math
import struct
from dataclasses import dataclass
from typing import BinaryIO, Iterable, List, Sequence, Tuple

MAGIC = b"\x93NUMPY"

#: The .npy type string of each protocol dtype.
DESCR = {"f32": "<f4", "f16": "<f2", "bf16": "<u2"}
_ITEM_BYTES = {"<f4": 4, "<f2": 2, "<u2": 2, "<i4": 4}  # <i4: a paged problem's page table


@dataclass(frozen=True)
class Array:
    """A .npy file's contents: its type string, shape and raw little-endian bytes."""

    descr: str
    shape: Tuple[int, ...]
    data: bytes

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def _read_header(stream: BinaryIO, name: str) -> Tuple[str, Tuple[int, ...]]:
    magic = stream.read(8)
    if magic[:6] != MAGIC:
        raise ValueError(f"{name}: not a .npy file")
    major = magic[6]
    if major == 1:
        (length,) = struct.unpack("<H", stream.read(2))
    elif major in (2, 3):
        (length,) = struct.unpack("<I", stream.read(4))
    else:
        raise ValueError(f"{name}: .npy format version {major} is not supported")
    header = ast.literal_eval(stream.read(length).decode("latin1"))
    if not isinstance(header, dict) or not {"descr", "fortran_order", "shape"} <= header.keys():
        raise ValueError(f"{name}: malformed .npy header {header!r}")
    if header["fortran_order"]:
        raise ValueError(f"{name}: Fortran order is not supported (the protocol uses C order)")
    descr = header["descr"]
    if descr not in _ITEM_BYTES:
        raise ValueError(f"{name}: type {descr!r} is not one of the protocol's {sorted(_ITEM_BYTES)}")
    return descr, tuple(int(d) for d in header["shape"])


def read(path: str) -> Array:
    """Reads a .npy file of one of the protocol's types; its size is checked against its shape."""
    with open(path, "rb") as stream:
        descr, shape = _read_header(stream, path)
        want = math.prod(shape) * _ITEM_BYTES[descr]
        data = stream.read(want + 1)
    if len(data) != want:
        raise ValueError(f"{path}: {len(data)} data bytes where shape {list(shape)} of {descr} needs {want}")
    return Array(descr, shape, data)


def header(descr: str, shape: Sequence[int]) -> bytes:
    """The format 1.0 header of a C-order array, padded to a multiple of 64 bytes."""
    dims = ", ".join(str(int(d)) for d in shape) + ("," if len(shape) == 1 else "")
    text = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    return MAGIC + b"\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def write(path: str, descr: str, shape: Sequence[int], payload: bytes) -> None:
    """Writes raw little-endian bytes as a .npy file. The payload is not checked
    against the shape: a test worker may write a wrong one on purpose."""
    with open(path, "wb") as stream:
        stream.write(header(descr, shape))
        stream.write(payload)


# ---- values <-> bytes --------------------------------------------------------

def bf16_to_float(bits: int) -> float:
    """The float a bf16 bit pattern stands for."""
    value: float = struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]
    return value


def float_to_bf16(value: float) -> int:
    """The bf16 bit pattern nearest to `value` (ties to even), from the exact float64."""
    if math.isnan(value):
        return 0x7FC0
    bits: int = struct.unpack("<Q", struct.pack("<d", value))[0]
    sign, exponent, mantissa = bits >> 63, (bits >> 52) & 0x7FF, bits & ((1 << 52) - 1)
    if value == 0 or exponent == 0:  # zero and float64 subnormals (far below bf16's)
        return sign << 15
    if math.isinf(value):
        return (sign << 15) | 0x7F80
    e = exponent - 1023
    if e < -126:  # bf16 subnormal: an integer count of 2^-133, rounded half to even
        return (sign << 15) | round(abs(value) * 2.0 ** 133)
    full = (1 << 52) | mantissa  # 53 bits
    kept, rest = full >> 45, full & ((1 << 45) - 1)  # 8 bits kept (1 hidden + 7)
    half = 1 << 44
    if rest > half or (rest == half and kept & 1):
        kept += 1
        if kept == 1 << 8:
            kept >>= 1
            e += 1
    if e > 127:
        return (sign << 15) | 0x7F80
    return (sign << 15) | ((e + 127) << 7) | (kept & 0x7F)


def decode(array: Array) -> List[float]:
    """The values of an array as Python floats, flat in storage order (bf16 decoded)."""
    n = array.size
    if array.descr == "<f4":
        return list(struct.unpack(f"<{n}f", array.data))
    if array.descr == "<f2":
        return list(struct.unpack(f"<{n}e", array.data))
    if array.descr == "<i4":
        return [float(x) for x in struct.unpack(f"<{n}i", array.data)]
    return [bf16_to_float(bits) for bits in struct.unpack(f"<{n}H", array.data)]


def _pack_one(code: str, value: float) -> bytes:
    try:
        return struct.pack(code, value)
    except OverflowError:  # past the largest finite value after rounding: infinity
        return struct.pack(code, math.copysign(math.inf, value))


def encode(values: Iterable[float], dtype: str) -> bytes:
    """Values rounded to nearest even in a protocol dtype ('f32', 'f16', 'bf16'), as bytes."""
    if dtype not in DESCR:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DESCR)})")
    values = [float(v) for v in values]
    if dtype == "bf16":
        return struct.pack(f"<{len(values)}H", *(float_to_bf16(v) for v in values))
    code = "<f" if dtype == "f32" else "<e"
    try:
        return struct.pack(f"<{len(values)}{code[1]}", *values)
    except OverflowError:
        return b"".join(_pack_one(code, v) for v in values)
