"""What the benchmark scripts share.

Importing this module, first thing, makes the process and every process it starts
(brokers through ``python -m shmlog``, client processes) run this checkout's shmlog,
with numba's cache in the checkout (``.cache/numba``, as ``make`` keeps it), and
puts ``perf/`` on the import path for the scripts' shared modules. A script that
runs roles in child processes of its own (``--role NAME --arguments JSON``) and
unwinds on SIGTERM uses :func:`run_role` and :func:`unwind_on_sigterm`.
"""

from __future__ import annotations

import json
import os
import signal
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERF = os.path.join(REPOSITORY, "perf")

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [REPOSITORY] + [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path])
for _path in (PERF, REPOSITORY):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def run_role(arguments, roles: dict) -> bool:
    """In a child process started with ``--role``: run that role with its JSON
    arguments and print its figures as one JSON line (what the parent reads).
    False in the parent (no role)."""
    if not arguments.role:
        return False
    print(json.dumps(roles[arguments.role](**json.loads(arguments.arguments))), flush=True)
    return True


def unwind_on_sigterm() -> None:
    """A SIGTERM (an operator, a harness's timeout) unwinds like an error, so the
    script's ``finally`` blocks kill its children, stop its brokers and remove their
    data and shared memory."""
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
