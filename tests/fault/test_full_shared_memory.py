"""A full /dev/shm is an error when shared memory is made, never a SIGBUS later: a
ring or a state table that /dev/shm has no room for is refused with
``StorageError`` and leaves nothing behind, and one that fits can be written to its
last page.

Method: each case runs a child Python in a private mount namespace (``unshare
--mount``) whose /dev/shm is a fresh 1 MiB tmpfs, so the host's /dev/shm is never
filled and the namespace's objects vanish with it (the test skips, saying so, when
namespaces or mounts are not permitted: they need root or CAP_SYS_ADMIN). The child
prints what happened; a child killed by a signal (SIGBUS) fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SHM_SIZE = 1 << 20
TIMEOUT_S = 120
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent('''
    import os, sys
    from shmlog.shm import shared_memory
    from shmlog.common.errors import ResourceLimitError
    from shmlog.ring import Ring
    from shmlog.shm.state import PartitionStateTable

    def refused(make):
        try:
            made = make()
        except ResourceLimitError as error:
            return f"refused: {error} (limit {error.limit})"
        made.close()
        return "made"

    print(refused(lambda: Ring.create("shmlog-full-ring", 4 << 20)))
    print(refused(lambda: PartitionStateTable.create("shmlog-full-state", 100_000)))
    print("left:", sorted(os.listdir(shared_memory.DIRECTORY)))
    ring = Ring.create("shmlog-fits", 256 << 10)
    ring.data[:] = 1                      # every page, the last one too
    print("written:", int(ring.data[-1]))
    ring.close()
    shared_memory.unlink("shmlog-fits")
''')


def run_with_small_shared_memory(code: str) -> subprocess.CompletedProcess:
    shell = (f"mount -t tmpfs -o size={SHM_SIZE},mode=1777 tmpfs /dev/shm && "
             f'exec "{sys.executable}" -c "$CHILD"')
    environment = dict(os.environ, CHILD=code,
                       PYTHONPATH=os.pathsep.join(filter(None, [REPOSITORY,
                                                                os.environ.get("PYTHONPATH")])))
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=environment)


def test_shared_memory_that_does_not_fit_is_refused_at_creation():
    probe = run_with_small_shared_memory("print('ok')")
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm (needs root or CAP_SYS_ADMIN): "
                    f"{probe.stderr.strip()}")
    result = run_with_small_shared_memory(CHILD)
    assert result.returncode == 0, \
        f"the child failed (exit {result.returncode}; a negative one is a signal):\n{result.stderr}"
    ring, table, left, written = result.stdout.splitlines()
    assert ring.startswith("refused: /dev/shm is full: ring 'shmlog-full-ring' needs"), ring
    assert table.startswith("refused: /dev/shm is full: partition state table"), table
    assert ring.endswith("(limit /dev/shm)") and table.endswith("(limit /dev/shm)")
    assert left == "left: []", "a refused object must not be left in /dev/shm"
    assert written == "written: 1"
