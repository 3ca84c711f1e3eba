"""CRC32C kernels agree with a bit-at-a-time reference on every length and alignment.

Goal: the checksum guarding every record batch is the standard CRC32C (Castagnoli),
on both paths shmlog has: the public :func:`shmlog.native.crc32c.crc32c` (the SSE4.2 path with
three interleaved lanes on hosts that have the instruction) and the slicing-by-8
software fallback ``_update_software``.

Method: the published check value; then every length from 0 to 100 and the lengths
around the interleave boundaries (three lanes of 256 and of 8192 bytes, where one
more or one fewer byte changes which loops run), compared with
``reference.reference_crc32c`` over the same seeded random bytes; start positions
that are not 8-byte aligned through ``crc32c_kernel(buffer, start, end)``; chaining of
the raw register across split points; and the input forms the public wrapper accepts.
Hypothesis adds random buffers and split points.
"""

from __future__ import annotations

import functools
import pathlib
import platform
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # for tests/reference.py
from reference import reference_crc32c  # noqa: E402
from shmlog.native import crc32c as crc_module  # noqa: E402
from shmlog.native.crc32c import crc32c, crc32c_kernel  # noqa: E402

CHECK_INPUT = b"123456789"
CHECK_VALUE = 0xE3069283            # the catalogue check value of CRC-32C (iSCSI)

LANE_SHORT_SIZE = 256               # restated from shmlog.native.crc32c, so a change is noticed
LANE_LONG_SIZE = 8192
BOUNDARY_LENGTHS = sorted({
    length + step
    for length in (3 * LANE_SHORT_SIZE, 2 * 3 * LANE_SHORT_SIZE, 3 * LANE_LONG_SIZE,
                   3 * LANE_LONG_SIZE + 3 * LANE_SHORT_SIZE, 2 * 3 * LANE_LONG_SIZE)
    for step in (-9, -8, -1, 0, 1, 7, 8, 9)
} | {100_003})
LENGTHS = list(range(101)) + BOUNDARY_LENGTHS

DATA = np.random.default_rng(20240521).integers(0, 256, max(LENGTHS) + 64, dtype=np.uint8)
DATA_BYTES = DATA.tobytes()


@functools.lru_cache(maxsize=None)
def expected(start: int, end: int) -> int:
    return reference_crc32c(DATA_BYTES[start:end])


def software_crc32c(buffer: np.ndarray, start: int, end: int) -> int:
    register = crc_module._update_software(np.uint32(0xFFFFFFFF), buffer, start, end)
    return int(register ^ np.uint32(0xFFFFFFFF))


def public_crc32c(buffer: np.ndarray, start: int, end: int) -> int:
    return crc32c(buffer[start:end])


def kernel_crc32c(buffer: np.ndarray, start: int, end: int) -> int:
    return int(crc32c_kernel(buffer, start, end))


PATHS = {"public": public_crc32c, "kernel": kernel_crc32c, "software": software_crc32c}


def test_reference_matches_the_check_value():
    assert reference_crc32c(CHECK_INPUT) == CHECK_VALUE
    assert reference_crc32c(b"") == 0


@pytest.mark.parametrize("path", PATHS)
def test_check_value(path):
    buffer = np.frombuffer(CHECK_INPUT, np.uint8)
    assert PATHS[path](buffer, 0, buffer.size) == CHECK_VALUE


def cpu_has_sse42() -> bool:
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    with open("/proc/cpuinfo") as cpuinfo:
        return any(line.startswith("flags") and "sse4_2" in line.split()
                   for line in cpuinfo)


def test_public_path_is_the_hardware_path_when_the_cpu_has_sse42():
    # The public wrapper goes through `_update`; on SSE4.2 hosts that must be the
    # interleaved hardware kernel, or the "public" cases here test the fallback twice.
    assert crc_module.HARDWARE == cpu_has_sse42()
    chosen = crc_module._update_hardware if crc_module.HARDWARE else crc_module._update_software
    assert crc_module._update is chosen


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("length", LENGTHS)
def test_matches_reference_at_every_length(path, length):
    assert PATHS[path](DATA, 0, length) == expected(0, length)


@pytest.mark.parametrize("path", ["kernel", "software"])
@pytest.mark.parametrize("start", [1, 2, 3, 5, 7, 9, 13])
@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 63, 767, 768, 769, 24575, 24576, 24577])
def test_unaligned_start(path, start, length):
    assert PATHS[path](DATA, start, start + length) == expected(start, start + length)


@pytest.mark.parametrize("update", ["_update", "_update_software"])
@pytest.mark.parametrize("split", [0, 1, 5, 8, 767, 769, 3000, 24576, 24582])
def test_raw_register_chains_across_a_split(update, split):
    # Both paths work on the raw register, so updating piecewise equals one update.
    kernel = getattr(crc_module, update)
    end = 3 * LANE_LONG_SIZE + 3 * LANE_SHORT_SIZE + 11
    register = kernel(np.uint32(0xFFFFFFFF), DATA, 0, split)
    register = kernel(register, DATA, split, end)
    assert int(register ^ np.uint32(0xFFFFFFFF)) == expected(0, end)


@pytest.mark.parametrize("form", ["bytes", "bytearray", "memoryview", "array",
                                  "strided array", "2-d array", "int32 array"])
def test_public_wrapper_input_forms(form):
    raw = DATA[:1000]
    data, as_bytes = {
        "bytes": (raw.tobytes(), raw.tobytes()),
        "bytearray": (bytearray(raw.tobytes()), raw.tobytes()),
        "memoryview": (memoryview(raw.tobytes()), raw.tobytes()),
        "array": (raw, raw.tobytes()),
        "strided array": (raw[::3], raw[::3].tobytes()),
        "2-d array": (raw.reshape(40, 25), raw.tobytes()),
        "int32 array": (raw.view(np.int32), raw.tobytes()),
    }[form]
    assert crc32c(data) == reference_crc32c(as_bytes)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=2500), start=st.integers(0, 16))
def test_random_buffers(data, start):
    buffer = np.frombuffer(bytes(start) + data, np.uint8)
    want = reference_crc32c(data)
    assert crc32c(data) == want
    assert kernel_crc32c(buffer, start, buffer.size) == want
    assert software_crc32c(buffer, start, buffer.size) == want


def test_every_single_byte_change_is_detected():
    # CRC32C detects every burst of up to 32 bits; a batch's CRC relies on it.
    buffer = DATA[:300].copy()
    original = crc32c(buffer)
    for position in range(buffer.size):
        for mask in (0x01, 0x80, 0xFF):
            buffer[position] ^= mask
            assert crc32c(buffer) != original, (position, mask)
            buffer[position] ^= mask
    assert crc32c(buffer) == original
