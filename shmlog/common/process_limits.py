"""The process's own limits that grow with the work: open files (``RLIMIT_NOFILE``)
and, in ``native.mapping``, memory mappings (``vm.max_map_count``).

Rules
-----
* A broker raises its soft open-files limit to the hard one at start (and says both
  when it says it serves): the soft limit is a default meant for interactive shells
  (often 1,024), the hard one is what the operator allows.
* Running out is a :class:`ResourceLimitError` that names the limit, its values and
  how to raise it, never an ``OSError`` from deep inside.
* :func:`limit_error` finds such a refusal in any error (a ``ResourceLimitError``
  already, or an ``OSError`` with ``EMFILE``, ``ENFILE``, ``ENOMEM`` or ``ENOSPC``
  among its causes): the broker's periodic work (``broker.scheduler``) keys its
  log-once on the limit it names.
"""

from __future__ import annotations

import errno
import logging
import resource

from .errors import ResourceLimitError

log = logging.getLogger(__name__)

__all__ = ["raise_open_files_limit", "open_files_error", "limit_error"]


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as error:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, error)
        else:
            return hard, hard
    return soft, hard


def open_files_error(error: OSError) -> ResourceLimitError | None:
    """The typed error for a refusal by the open-files limit (the process's EMFILE or
    the system's ENFILE); None for any other ``OSError``."""
    if error.errno == errno.EMFILE:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return ResourceLimitError(
            f"too many open files: the process's limit (RLIMIT_NOFILE) is {soft} (hard "
            f"limit {hard}); raise it (ulimit -n, or LimitNOFILE= in a systemd unit) or "
            f"host fewer partitions and producers", limit="RLIMIT_NOFILE")
    if error.errno == errno.ENFILE:
        return ResourceLimitError(
            "too many open files on the host (fs.file-max); raise it with "
            "sysctl -w fs.file-max=... or stop other processes' files",
            limit="fs.file-max")
    return None


def _memory_or_space_error(error: OSError) -> ResourceLimitError | None:
    """The typed error for ``ENOMEM`` (memory, or vm.max_map_count for a mapping) and
    ``ENOSPC`` (a full filesystem: the data directory's or /dev/shm); None otherwise."""
    where = f" ({error.filename})" if error.filename else ""
    if error.errno == errno.ENOMEM:
        return ResourceLimitError(
            f"out of memory{where} (ENOMEM): free memory on the host, raise the "
            f"process's address-space limit (ulimit -v, LimitAS= in a systemd unit) or, "
            f"for mappings, sysctl -w vm.max_map_count=...", limit="memory")
    if error.errno == errno.ENOSPC:
        return ResourceLimitError(
            f"no space left on a device{where} (ENOSPC): free space on the data "
            f"directory's filesystem or /dev/shm (df -h), or grow it (for /dev/shm: "
            f"mount -o remount,size=...)", limit="disk space")
    return None


def limit_error(error: BaseException) -> ResourceLimitError | None:
    """The refusal by a process or host limit behind ``error``, typed: ``error``
    itself when it is a :class:`ResourceLimitError`, else the first ``OSError`` of
    its causes (``raise ... from``) with ``EMFILE``, ``ENFILE``, ``ENOMEM`` or
    ``ENOSPC``; None when no limit is behind it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:      # a cycle ends the walk
        seen.add(id(current))
        if isinstance(current, ResourceLimitError):
            return current
        if isinstance(current, OSError):
            typed = open_files_error(current) or _memory_or_space_error(current)
            if typed is not None:
                return typed
        current = current.__cause__ or current.__context__
    return None
