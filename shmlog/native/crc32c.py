"""CRC32C (Castagnoli), the checksum of every record batch.

Theory of operation
-------------------
On x86-64 with SSE4.2 the ``crc32`` instruction folds 8 bytes per instruction with
a latency of 3 cycles but a throughput of one per cycle, so a single dependency
chain runs at a third of the possible speed. :func:`_update_hardware` therefore
splits long inputs into three equal lanes, runs three independent chains, and
joins them with the "shift by N zero bytes" operator (a linear map over GF(2),
precomputed here as four 256-entry tables per lane length). Where the instruction
is missing, :func:`_update_software` uses slicing-by-8 tables.

Both paths operate on the raw CRC register; :func:`crc32c_kernel` and
:func:`crc32c` apply the standard pre- and post-inversion, so results match every
other CRC32C implementation (check value: ``crc32c(b"123456789") == 0xE3069283``).
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit import kernel, load_u64

__all__ = ["crc32c", "crc32c_kernel", "HARDWARE"]

POLYNOMIAL_REFLECTED = 0x82F63B78
# Lane lengths for the three-way interleave: long lanes amortise the two table
# shifts that join them and stream memory better (8 KiB lanes: ~9.4 GB/s from memory
# against ~6.6 GB/s for 2 KiB ones, measured here); short lanes keep medium inputs
# (a few KiB) interleaved.
LANE_LONG_SIZE = 8192
LANE_SHORT_SIZE = 256
assert LANE_LONG_SIZE % 8 == 0
assert LANE_SHORT_SIZE % 8 == 0


def _has_sse42() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return any(line.startswith("flags") and " sse4_2" in line for line in cpuinfo)
    except OSError:
        return False


HARDWARE = _has_sse42()


# --- GF(2) arithmetic, used once at import to build tables ---------------------

def _multiply_mod_p(a: int, b: int) -> int:
    """(a * b) mod P for reflected 32-bit polynomials."""
    product = 0
    mask = 1 << 31
    while mask:
        if a & mask:
            product ^= b
        b = (b >> 1) ^ POLYNOMIAL_REFLECTED if b & 1 else b >> 1
        mask >>= 1
    return product


def _x_power_mod_p(bits: int) -> int:
    """x**bits mod P in reflected form."""
    result = 1 << 31            # x**0
    square = 1 << 30            # x**1
    while bits:
        if bits & 1:
            result = _multiply_mod_p(square, result)
        square = _multiply_mod_p(square, square)
        bits >>= 1
    return result


def _shift_tables(byte_count: int) -> np.ndarray:
    """Tables T with crc_shifted = T[0][c & 255] ^ T[1][c >> 8 & 255] ^ ..."""
    factor = _x_power_mod_p(8 * byte_count)
    tables = np.zeros((4, 256), dtype=np.uint32)
    for lane in range(4):
        for value in range(256):
            tables[lane, value] = _multiply_mod_p(factor, value << (8 * lane))
    return tables


def _slicing_tables() -> np.ndarray:
    tables = np.zeros((8, 256), dtype=np.uint32)
    for value in range(256):
        crc = value
        for _ in range(8):
            crc = (crc >> 1) ^ POLYNOMIAL_REFLECTED if crc & 1 else crc >> 1
        tables[0, value] = crc
    for lane in range(1, 8):
        for value in range(256):
            previous = int(tables[lane - 1, value])
            tables[lane, value] = (previous >> 8) ^ int(tables[0, previous & 0xFF])
    return tables


_SHIFT_LONG = _shift_tables(LANE_LONG_SIZE)
_SHIFT_SHORT = _shift_tables(LANE_SHORT_SIZE)
_SLICING = _slicing_tables()


# --- kernels -------------------------------------------------------------------

@intrinsic
def _crc32_u64(typingctx, crc, data):
    """The SSE4.2 ``crc32 r64, r/m64`` instruction."""
    def codegen(context, builder, signature, args):
        function_type = ir.FunctionType(ir.IntType(64), [ir.IntType(64), ir.IntType(64)])
        function = cgutils.get_or_insert_function(
            builder.module, function_type, "llvm.x86.sse42.crc32.64.64")
        return builder.call(function, args)
    return types.uint64(types.uint64, types.uint64), codegen


@intrinsic
def _crc32_u8(typingctx, crc, data):
    """The SSE4.2 ``crc32 r32, r/m8`` instruction."""
    def codegen(context, builder, signature, args):
        function_type = ir.FunctionType(ir.IntType(32), [ir.IntType(32), ir.IntType(8)])
        function = cgutils.get_or_insert_function(
            builder.module, function_type, "llvm.x86.sse42.crc32.32.8")
        return builder.call(function, args)
    return types.uint32(types.uint32, types.uint8), codegen


@kernel
def _shift(tables, crc):
    return (tables[0, crc & 0xFF] ^ tables[1, (crc >> 8) & 0xFF]
            ^ tables[2, (crc >> 16) & 0xFF] ^ tables[3, crc >> 24])


@kernel
def _interleave(crc, buffer, position, end, lane_size, tables):
    """Fold ``3 * lane_size`` byte blocks with three independent chains."""
    while end - position >= 3 * lane_size:
        crc1 = np.uint64(0)
        crc2 = np.uint64(0)
        stop = position + lane_size
        while position < stop:
            crc = _crc32_u64(crc, load_u64(buffer, position))
            crc1 = _crc32_u64(crc1, load_u64(buffer, position + lane_size))
            crc2 = _crc32_u64(crc2, load_u64(buffer, position + 2 * lane_size))
            position += 8
        crc = np.uint64(_shift(tables, np.uint32(crc))) ^ crc1
        crc = np.uint64(_shift(tables, np.uint32(crc))) ^ crc2
        position += 2 * lane_size
    return crc, position


@kernel
def _update_hardware(crc, buffer, start, end):
    register = np.uint64(crc)
    register, position = _interleave(register, buffer, start, end, LANE_LONG_SIZE, _SHIFT_LONG)
    register, position = _interleave(register, buffer, position, end, LANE_SHORT_SIZE, _SHIFT_SHORT)
    while end - position >= 8:
        register = _crc32_u64(register, load_u64(buffer, position))
        position += 8
    narrow = np.uint32(register)
    while position < end:
        narrow = _crc32_u8(narrow, buffer[position])
        position += 1
    return narrow


@kernel
def _update_software(crc, buffer, start, end):
    register = np.uint32(crc)
    position = start
    tables = _SLICING
    while end - position >= 8:
        word = load_u64(buffer, position) ^ np.uint64(register)
        register = (tables[7, word & 0xFF] ^ tables[6, (word >> 8) & 0xFF]
                    ^ tables[5, (word >> 16) & 0xFF] ^ tables[4, (word >> 24) & 0xFF]
                    ^ tables[3, (word >> 32) & 0xFF] ^ tables[2, (word >> 40) & 0xFF]
                    ^ tables[1, (word >> 48) & 0xFF] ^ tables[0, word >> 56])
        position += 8
    while position < end:
        register = tables[0, (register ^ buffer[position]) & 0xFF] ^ (register >> 8)
        position += 1
    return np.uint32(register)


_update = _update_hardware if HARDWARE else _update_software


@kernel
def crc32c_kernel(buffer, start, end):
    """CRC32C of ``buffer[start:end]``; the caller guarantees the bounds."""
    return np.uint32(_update(np.uint32(0xFFFFFFFF), buffer, start, end) ^ np.uint32(0xFFFFFFFF))


def crc32c(data) -> int:
    """CRC32C of a bytes-like object or a 1-D uint8 array.

    Parameters
    ----------
    data : bytes-like or numpy.ndarray
        The bytes to checksum (any object exporting a contiguous buffer).

    Returns
    -------
    int
        The checksum, as an unsigned 32-bit integer.
    """
    buffer = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags.c_contiguous:
        buffer = np.ascontiguousarray(buffer).view(np.uint8).reshape(-1)
    return int(crc32c_kernel(buffer, 0, buffer.size))
