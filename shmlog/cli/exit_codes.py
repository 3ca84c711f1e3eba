"""The ``shmlog`` command's exit codes (the convention of every subcommand).

A verb ended by a signal (Ctrl-C's SIGINT, SIGTERM) exits with 128 plus the signal's
number, as Kafka's console tools do (the JVM's exit status on a signal it handles:
130 for SIGINT, 143 for SIGTERM) and as a shell reports a command a signal ended.
The servers (``broker``, ``zookeeper``, ``cluster up``) are the exception: a stop
signal is how they are meant to end, so they exit 0.
"""

from __future__ import annotations

import signal

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED", "exit_on_signal"]

EXIT_OK = 0
EXIT_FAILURE = 1        # a problem was found (corruption, a failed request)
EXIT_USAGE = 2          # argparse's own code for a usage error
EXIT_SIGNALLED = 128    # plus the signal's number: the shell's and the JVM's rule
EXIT_INTERRUPTED = EXIT_SIGNALLED + signal.SIGINT       # 130: Ctrl-C


def exit_on_signal(number: int) -> int:
    """The exit code of a verb ended by signal ``number``."""
    return EXIT_SIGNALLED + int(number)
