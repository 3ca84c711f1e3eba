"""Opening the files a Kafka listener's settings name: secrets checked private, every
one bounded in size, every failure typed.

Rules
-----
* A secret (the SASL credentials file, a TLS private key) is refused unless it is a
  regular file owned by the broker's user (or root), readable and writable by its
  owner only: the check ``ssh`` makes of a private key, and
  ``config/curve_keys`` of a CURVE secret key (mode ``& 0o077`` refused: chmod 600).
  Whoever else may read it holds the broker's identity or its users' credentials;
  whoever else may write it can let anyone in.
* The check is made on the opened descriptor (``fstat``), and the file is read, or
  handed to OpenSSL, through that same descriptor (``/proc/self/fd/N``, Linux's name
  for an open descriptor), so what was checked is what is used: a file swapped
  between the two is never read.
* ``follow_links``: shmlog's own credentials file is opened with ``O_NOFOLLOW`` (a
  symbolic link there is refused, as a CURVE secret key is); a TLS key may be a link
  (certbot's ``live/`` names are links into ``archive/``), and then the file it
  names is the one checked.
* A file larger than its bound is refused before it is read (a wrong path naming a
  log or a device), and a device or a FIFO is no regular file. Every refusal is an
  :class:`~shmlog.common.errors.InvalidConfigError` naming the setting and the path.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Iterator

from ..common.access import owner_name
from ..common.errors import InvalidConfigError

__all__ = ["opened", "descriptor_path", "read"]


@contextlib.contextmanager
def opened(path: str, setting: str, size_max: int, *, private: bool,
           follow_links: bool = True) -> Iterator[int]:
    """A descriptor of regular file ``path``, checked (``private``: a secret's rules),
    closed on leaving the block.

    Raises
    ------
    InvalidConfigError
        It cannot be opened, is not a regular file, is larger than ``size_max``, or
        (``private``) is another user's or open to group or others.
    """
    if not isinstance(path, str) or not path:
        raise InvalidConfigError(f"{setting} must be the path of a file, got {path!r:.200}")
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    try:
        descriptor = os.open(path, flags)
    except OSError as error:
        link = " (a symbolic link is refused here: name the file itself)" \
            if not follow_links and os.path.islink(path) else ""
        raise InvalidConfigError(f"{setting}: cannot open {path}: {error}{link}") from error
    try:
        _check(os.fstat(descriptor), path, setting, size_max, private)
        yield descriptor
    finally:
        os.close(descriptor)


def descriptor_path(descriptor: int) -> str:
    """A path that opens the file ``descriptor`` is open on, for APIs that take a path
    (OpenSSL's): the same file even if its name was changed meanwhile."""
    return f"/proc/self/fd/{descriptor}"


def read(descriptor: int, path: str, setting: str, size_max: int) -> bytes:
    """The whole file from its start, at most ``size_max`` bytes (it may have grown
    since it was checked).

    Raises
    ------
    InvalidConfigError
        It cannot be read, or is longer than ``size_max``.
    """
    chunks = []
    offset = 0
    try:
        while offset <= size_max and (chunk := os.pread(descriptor, 1 << 16, offset)):
            chunks.append(chunk)
            offset += len(chunk)
    except OSError as error:
        raise InvalidConfigError(f"{setting}: cannot read {path}: {error}") from error
    if offset > size_max:
        raise InvalidConfigError(f"{setting}: {path} grew past the {size_max} bytes such a "
                                 f"file can be while it was read")
    return b"".join(chunks)


def _check(status: os.stat_result, path: str, setting: str, size_max: int,
           private: bool) -> None:
    if not stat.S_ISREG(status.st_mode):
        raise InvalidConfigError(f"{setting}: {path} is not a regular file")
    if status.st_size > size_max:
        raise InvalidConfigError(f"{setting}: {path} is {status.st_size} bytes, more than "
                                 f"the {size_max} such a file can be: is it the right file?")
    if not private:
        return
    if status.st_uid not in (0, os.geteuid()):
        raise InvalidConfigError(
            f"{setting}: {path} belongs to {owner_name(status.st_uid)}, who could change "
            f"it: a secret must be the broker's user's ({owner_name(os.geteuid())}) or "
            f"root's")
    mode = stat.S_IMODE(status.st_mode)
    if mode & 0o077:
        raise InvalidConfigError(f"{setting}: {path} has mode {mode:o}: a secret must be "
                                 f"readable by its owner only (chmod 600 {path})")
