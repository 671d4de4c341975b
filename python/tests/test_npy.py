"""The standard-library .npy reader and writer, and rounding to the protocol's dtypes."""
import math
import struct

import pytest

from flashcheck_worker import npy


def test_header_is_padded_to_64_bytes_and_ends_in_a_newline():
    for shape in [(), (3,), (2, 3, 4, 5), (123456789, 1)]:
        head = npy.header("<f4", shape)
        assert len(head) % 64 == 0
        assert head.endswith(b"\n") and head.startswith(b"\x93NUMPY\x01\x00")


def test_written_files_read_back(tmp_path):
    path = str(tmp_path / "a.npy")
    values = [0.5, -1.25, 3.0, 1e-3, -0.0, 65504.0]
    for dtype in ("f32", "f16", "bf16"):
        npy.write(path, npy.DESCR[dtype], (2, 3), npy.encode(values, dtype))
        array = npy.read(path)
        assert array.descr == npy.DESCR[dtype] and array.shape == (2, 3)
        back = npy.decode(array)
        assert len(back) == 6
        for got, want in zip(back, values):
            # each value is exact in the dtype, or within its half ulp
            assert got == pytest.approx(want, rel=2 ** -8 if dtype == "bf16" else 2 ** -11)


def test_numpy_reads_what_the_package_writes(tmp_path):
    np = pytest.importorskip("numpy")
    path = str(tmp_path / "a.npy")
    npy.write(path, "<f2", (2, 2), npy.encode([1, 2, 3, 4], "f16"))
    array = np.load(path)
    assert array.dtype == np.float16 and array.shape == (2, 2)
    assert array.tolist() == [[1, 2], [3, 4]]
    np.save(path, np.arange(6, dtype="<f4").reshape(3, 2))
    assert npy.decode(npy.read(path)) == [0, 1, 2, 3, 4, 5]


def test_bf16_rounds_to_nearest_even_from_the_exact_value():
    assert npy.float_to_bf16(1.0) == 0x3F80
    assert npy.float_to_bf16(1.0 + 2 ** -8) == 0x3F80  # a tie: to the even 1.0
    assert npy.float_to_bf16(1.0 + 3 * 2 ** -8) == 0x3F82  # a tie: to the even 1 + 2^-6
    assert npy.float_to_bf16(1.0 + 2 ** -8 + 2 ** -40) == 0x3F81  # just past the tie (float32 would round it away)
    assert npy.float_to_bf16(-2.0) == 0xC000
    assert npy.float_to_bf16(math.inf) == 0x7F80 and npy.float_to_bf16(-math.inf) == 0xFF80
    assert npy.float_to_bf16(1e39) == 0x7F80  # past bf16's largest finite value
    assert npy.float_to_bf16(math.nan) == 0x7FC0
    assert npy.float_to_bf16(2.0 ** -133) == 0x0001  # the smallest subnormal
    assert npy.float_to_bf16(2.0 ** -135) == 0x0000  # below half of it
    assert npy.float_to_bf16(-0.0) == 0x8000
    for bits in (0x0001, 0x007F, 0x0080, 0x3F80, 0x7F7F, 0xBEEF):
        assert npy.float_to_bf16(npy.bf16_to_float(bits)) == bits


def test_overflow_becomes_infinity_in_f16_and_f32():
    halves = struct.unpack("<3e", npy.encode([70000.0, -1e10, 1.0], "f16"))
    assert halves == (math.inf, -math.inf, 1.0)
    singles = struct.unpack("<2f", npy.encode([1e300, 2.0], "f32"))
    assert singles == (math.inf, 2.0)


def test_bad_files_are_refused_with_their_reason(tmp_path):
    path = str(tmp_path / "bad.npy")
    npy.write(path, "<f4", (2, 2), npy.encode([1, 2, 3], "f32"))  # 12 bytes for 16
    with pytest.raises(ValueError, match="12 data bytes where shape \\[2, 2\\] of <f4 needs 16"):
        npy.read(path)
    npy.write(path, "<f8", (1,), struct.pack("<d", 1.0))
    with pytest.raises(ValueError, match="'<f8' is not one of"):
        npy.read(path)
    with open(path, "wb") as f:
        f.write(b"not an npy file")
    with pytest.raises(ValueError, match="not a .npy file"):
        npy.read(path)
    with pytest.raises(ValueError, match="unknown dtype 'f64'"):
        npy.encode([1.0], "f64")
