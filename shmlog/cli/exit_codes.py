"""The ``shmlog`` command's exit codes (the convention of every subcommand)."""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_FAILURE = 1        # a problem was found (corruption, a failed request)
EXIT_USAGE = 2          # argparse's own code for a usage error
