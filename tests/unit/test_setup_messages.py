"""A first ``make`` says what it does: it names each step (the virtual environment,
the dependencies, the numba kernels group by group, the Spark bulk reader) before
the minutes they take; the bulk reader's first ``javac`` says so on stderr, and a
cached jar says nothing.

Method: ``make -n`` (prints the recipes, runs nothing) in a copy of the Makefile and
the files its targets depend on, so this venv is never touched; the two set-up
modules run as ``make`` runs them, as subprocesses; the bulk reader is compiled by
a stand-in ``javac`` (a script that succeeds) into a fresh cache, so no JVM starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


def run(*arguments, **options):
    return subprocess.run([*arguments], capture_output=True, text=True, timeout=TIMEOUT_S,
                          **options)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this host")
def test_a_first_make_names_each_step_before_it_runs(tmp_path):
    for name in ("Makefile", "setup.cfg", "pyproject.toml"):
        shutil.copy(REPOSITORY / name, tmp_path / name)
    # --no-print-directory: under `make test` this make is a sub-make, which would
    # name its directory (a pytest temporary one) on its first line.
    planned = run("make", "--no-print-directory", "-n", "test", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    lines = planned.stdout.splitlines()

    def first(text):
        found = [number for number, line in enumerate(lines) if text in line]
        assert found, f"make -n test does not run {text!r}:\n{planned.stdout}"
        return found[0]

    assert first("creating the virtual environment") < first("pip install")
    assert first("shmlog: installing shmlog and its dependencies") < first("pip install")
    assert first("pip install") < first("shmlog.devtools.compile_kernels") \
        < first("shmlog.spark.compile_reader") < first("-m pytest")


def test_compile_kernels_reports_each_group_of_kernels():
    done = run(sys.executable, "-m", "shmlog.devtools.compile_kernels")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("shmlog: compiling its kernels into")
    steps = [line for line in lines if line.startswith("shmlog: [")]
    assert [line.split("]")[0] for line in steps] == [f"shmlog: [{number}/5"
                                                      for number in range(1, 6)]
    assert all(line.endswith(" s)") for line in steps)
    assert lines[-1].startswith("shmlog: kernels ready in")


def test_the_first_javac_of_the_bulk_reader_says_so_and_a_cached_jar_is_quiet(tmp_path):
    pytest.importorskip("pyspark")
    jdk = tmp_path / "jdk" / "bin"
    jdk.mkdir(parents=True)
    (jdk / "javac").write_text("#!/bin/sh\nexit 0\n")      # compiles nothing, succeeds
    (jdk / "javac").chmod(0o755)
    variables = {**os.environ, "JAVA_HOME": str(jdk.parent),
                 "SHMLOG_CACHE_DIR": str(tmp_path / "jars")}
    first = run(sys.executable, "-m", "shmlog.spark.compile_reader", env=variables)
    assert first.returncode == 0, first.stderr
    assert "compiling the shmlog Spark bulk reader with " + str(jdk / "javac") in first.stderr
    assert "Spark bulk reader ready" in first.stdout
    assert len(os.listdir(tmp_path / "jars")) == 1
    again = run(sys.executable, "-m", "shmlog.spark.compile_reader", env=variables)
    assert again.returncode == 0, again.stderr
    assert "compiling" not in again.stderr
    assert "Spark bulk reader ready" in again.stdout


def test_without_a_jdk_the_reader_step_says_why_and_make_goes_on(tmp_path):
    pytest.importorskip("pyspark")
    variables = {**os.environ, "JAVA_HOME": str(tmp_path / "jre-only")}
    done = run(sys.executable, "-m", "shmlog.spark.compile_reader", env=variables)
    assert done.returncode == 0, done.stderr
    assert "no Spark bulk reader" in done.stdout and "jre-only" in done.stdout
