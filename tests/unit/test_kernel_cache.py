"""numba's disk cache is keyed by shmlog's whole source (``native/jit.py``): a fresh
process caches its kernels under ``<NUMBA_CACHE_DIR>/shmlog-<fingerprint>``, and a
change to any source file - not only the file that defines a kernel - changes the
fingerprint. (numba alone checks the defining file's stamp only: a kernel that
inlines another file's function or constants ran stale machine code after that file
changed.)

Method: a fresh interpreter with its own NUMBA_CACHE_DIR; a copy of the package
whose files are edited.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from shmlog.native.jit import PACKAGE_DIRECTORY, cache_directory, source_fingerprint

TIMEOUT_S = 300


def test_a_process_caches_its_kernels_under_the_source_fingerprint(tmp_path):
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", "import numpy as np\n"
         "from shmlog.native.crc32c import crc32c\n"
         "print(crc32c(np.frombuffer(b'123456789', np.uint8)))"],
        env=environment, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 0xE3069283          # CRC-32C's check value
    directory = tmp_path / f"shmlog-{source_fingerprint()}"
    assert [path for path in directory.rglob("*.nbi")], "no kernel cached there"
    assert os.listdir(tmp_path) == [directory.name]


def test_the_directory_follows_the_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert cache_directory() == str(tmp_path / f"shmlog-{source_fingerprint()}")
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_directory().startswith(str(tmp_path / "xdg" / "shmlog" / "numba" / "shmlog-"))


def test_any_source_change_changes_the_fingerprint(tmp_path):
    copy = tmp_path / "shmlog"
    shutil.copytree(PACKAGE_DIRECTORY, copy,
                    ignore=shutil.ignore_patterns("__pycache__", "jvm", "*.pyc"))
    assert source_fingerprint(copy) == source_fingerprint()
    fingerprints = {source_fingerprint(copy)}
    # A layout's constants, read by kernels defined in other files; then a file added.
    layout = copy / "shm" / "ring_layout.py"
    layout.write_text(layout.read_text() + "\n# changed\n")
    fingerprints.add(source_fingerprint(copy))
    (copy / "record" / "new_module.py").write_text("X = 1\n")
    fingerprints.add(source_fingerprint(copy))
    assert len(fingerprints) == 3
