"""The one place where numba is configured, plus unaligned memory access.

Rules
-----
* Every compiled kernel in shmlog is declared with :func:`kernel`, so the numba
  options (on-disk cache, no GIL, numpy's error model) are set here and only here.
* Kernels are private (``_name``) and sit behind a public Python wrapper that
  validates its inputs; kernels return status codes and never raise.
* **The disk cache is keyed by shmlog's whole source** (:func:`cache_directory`):
  kernels are kept in ``<NUMBA_CACHE_DIR>/shmlog-<fingerprint>`` (without the
  variable, ``~/.cache/shmlog/numba/shmlog-<fingerprint>``), the fingerprint a hash
  of every ``.py`` file of the package. numba checks only the stamp of the file that
  defines a kernel: a kernel that inlines a function or reads a constant (a layout's
  offsets, a limit) from another file kept its old machine code when only that other
  file changed - after a ``git pull``, an edit, or a layout's version bump - and ran
  it silently. Any change of the source now compiles every kernel once, afresh.

Theory of operation
-------------------
Record batches are packed byte streams: a field may start at any byte position.
numpy views cannot express "the u32 at byte 13" without building an array object
per access, which is far too slow inside a per-record loop. The ``load_*`` and
``store_*`` intrinsics below emit a single LLVM load or store with ``align 1``;
on x86-64 and AArch64 that is one ordinary ``mov``/``ldr``. They do **no bounds
checking**: the calling kernel must prove ``0 <= position`` and
``position + width <= buffer.size`` first, which every kernel in shmlog does
before it touches a field.
"""

from __future__ import annotations

import hashlib
import os
import pathlib

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "kernel", "cache_directory", "source_fingerprint", "copy_bytes", "prefetch",
    "load_u16", "load_u32", "load_i16", "load_i32", "load_i64", "load_u64",
    "store_u16", "store_u32", "store_i16", "store_i32", "store_i64", "store_u64",
]


PACKAGE_DIRECTORY = pathlib.Path(__file__).resolve().parent.parent


def source_fingerprint(package: pathlib.Path = PACKAGE_DIRECTORY) -> str:
    """A hash of every Python source file of the package at ``package`` (their paths
    and bytes): what its compiled kernels were built from."""
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_directory() -> str:
    """Where the kernels of this source are cached (see the module's rules)."""
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shmlog", "numba")
    return os.path.join(base, f"shmlog-{source_fingerprint()}")


# Before any kernel is declared: numba's cache locator reads it as each one is.
numba.config.CACHE_DIR = cache_directory()


def kernel(function=None, **overrides):
    """Compile ``function`` with shmlog's numba options.

    ``cache=True`` keeps compiled code on disk (:func:`cache_directory`) so only the
    first process pays compile time; ``nogil=True`` lets Python threads run
    kernels in parallel; ``error_model="numpy"`` removes the division-by-zero
    branches numba would otherwise put into every integer division.
    """
    options = {"cache": True, "nogil": True, "error_model": "numpy"}
    options.update(overrides)
    if function is None:
        return lambda f: numba.njit(**options)(f)
    return numba.njit(**options)(function)


def _is_byte_buffer(buffer) -> bool:
    """A contiguous 1-D uint8 array, or ``bytes`` (a read-only buffer of the same model)."""
    return (isinstance(buffer, (types.Array, types.Bytes)) and buffer.ndim == 1
            and buffer.layout == "C" and buffer.dtype == types.uint8)


def _element_pointer(context, builder, buffer_type, buffer, position_type, position, bits):
    array = context.make_array(buffer_type)(context, builder, buffer)
    index = context.cast(builder, position, position_type, types.intp)
    byte_pointer = builder.gep(array.data, [index])
    return builder.bitcast(byte_pointer, ir.IntType(bits).as_pointer())


def _make_load(value_type):
    bits = value_type.bitwidth

    @intrinsic
    def load(typingctx, buffer, position):
        if not _is_byte_buffer(buffer) or not isinstance(position, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            pointer = _element_pointer(context, builder, signature.args[0], args[0],
                                       signature.args[1], args[1], bits)
            return builder.load(pointer, align=1)

        return value_type(buffer, position), codegen

    return load


def _make_store(value_type):
    bits = value_type.bitwidth

    @intrinsic
    def store(typingctx, buffer, position, value):
        if not _is_byte_buffer(buffer) or not isinstance(position, types.Integer):
            return None
        if not isinstance(value, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            pointer = _element_pointer(context, builder, signature.args[0], args[0],
                                       signature.args[1], args[1], bits)
            stored = context.cast(builder, args[2], signature.args[2], value_type)
            builder.store(stored, pointer, align=1)
            return context.get_dummy_value()

        return types.none(buffer, position, value), codegen

    return store


load_u16 = _make_load(types.uint16)
load_u32 = _make_load(types.uint32)
load_u64 = _make_load(types.uint64)
load_i16 = _make_load(types.int16)
load_i32 = _make_load(types.int32)
load_i64 = _make_load(types.int64)
store_u16 = _make_store(types.uint16)
store_u32 = _make_store(types.uint32)
store_u64 = _make_store(types.uint64)
store_i16 = _make_store(types.int16)
store_i32 = _make_store(types.int32)
store_i64 = _make_store(types.int64)


@intrinsic
def copy_bytes(typingctx, target, target_position, source, source_position, length):
    """``target[target_position:+length] = source[source_position:+length]`` as one
    ``llvm.memcpy`` (libc's memcpy: non-temporal stores for large copies, which a
    compiled element loop does not get). No bounds checks; ranges must not overlap.
    """
    if not (_is_byte_buffer(target) and _is_byte_buffer(source)):
        return None
    for argument in (target_position, source_position, length):
        if not isinstance(argument, types.Integer):
            return None

    def codegen(context, builder, signature, args):
        target_type, target_position_type, source_type, source_position_type, length_type = \
            signature.args
        target_pointer = _element_pointer(context, builder, target_type, args[0],
                                          target_position_type, args[1], 8)
        source_pointer = _element_pointer(context, builder, source_type, args[2],
                                          source_position_type, args[3], 8)
        count = context.cast(builder, args[4], length_type, types.intp)
        cgutils.raw_memcpy(builder, target_pointer, source_pointer, count, 1)
        return context.get_dummy_value()

    return types.none(target, target_position, source, source_position, length), codegen


@intrinsic
def prefetch(typingctx, buffer, position):
    """Hint the CPU to load the cache line at ``buffer[position]`` (``llvm.prefetch``,
    for reading, into every cache level): a walk whose next position depends on the
    bytes it reads stalls on each line it has not reached yet, and asking for one a
    few records ahead overlaps those waits. A prefetch never faults, so ``position``
    may lie past the end of ``buffer`` (it is then a no-op at worst)."""
    if not _is_byte_buffer(buffer) or not isinstance(position, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        pointer = _element_pointer(context, builder, signature.args[0], args[0],
                                   signature.args[1], args[1], 8)
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [pointer.type, ir.IntType(32),
                                                            ir.IntType(32), ir.IntType(32)]),
            "llvm.prefetch.p0i8")
        builder.call(function, [pointer, ir.Constant(ir.IntType(32), 0),
                                ir.Constant(ir.IntType(32), 3), ir.Constant(ir.IntType(32), 1)])
        return context.get_dummy_value()

    return types.none(buffer, position), codegen
