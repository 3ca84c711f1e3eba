"""The process's own limits that grow with the work: open files (``RLIMIT_NOFILE``)
and, in ``native.mapping``, memory mappings (``vm.max_map_count``).

Rules
-----
* A broker raises its soft open-files limit to the hard one at start (and says both
  when it says it serves): the soft limit is a default meant for interactive shells
  (often 1,024), the hard one is what the operator allows.
* Running out is a :class:`ResourceLimitError` that names the limit, its values and
  how to raise it, never an ``OSError`` from deep inside.
"""

from __future__ import annotations

import errno
import logging
import resource

from .errors import ResourceLimitError

log = logging.getLogger(__name__)

__all__ = ["raise_open_files_limit", "open_files_error"]


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
