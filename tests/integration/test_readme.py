"""README.md runs as written: every command and snippet it shows works, in order, from
a fresh directory, so a README that drifts from the code fails the suite; and the
documentation points only at files of the repository.

Which blocks run (README.md states the same convention to its readers): a fenced
block tagged ``sh`` is shell commands, one tagged ``python`` is a Python snippet;
both are run. An untagged block is not run (a synopsis, sample output, or a long job
with tests of its own, such as ``make bench``). Any other tag fails this test, so no
block quietly drops out of the run.

The opening block (``make demo`` / ``make test``) is skipped on purpose: it sets up
the clone and runs this very suite, so running it here would recurse. The test checks
that the block it skips is exactly that one.

Method, so that the test does what a person pasting the blocks in order does:

* The working directory is a fresh temporary directory, with ``.venv`` linked to the
  virtual environment running the test (``sys.prefix``) and ``.cache`` to the
  repository's (where ``make`` keeps compiled kernels), as in a clone after ``make``:
  the README's set-up lines after ``make`` work as written.
* Every ``sh`` block goes, in order, to one bash session (``set -e -o pipefail``), as
  into one terminal: a broker started there in the background (``shmlog broker ... &``)
  serves the later blocks until a later block stops it (``kill %1``). A block runs with
  stdin from /dev/null, so no command can swallow the next block.
* Every ``python`` block runs with this interpreter (the venv's), in the same directory,
  with the venv's ``bin`` first on PATH.
* Each block is bounded (``BLOCK_TIMEOUT_S``) and so is the whole run
  (``TOTAL_TIMEOUT_S``): a cold run compiles numba kernels and starts Spark.
* The bash session and every Python block run in process groups of their own, which
  are killed at the end whatever happened (the background broker, Spark's JVM and any
  broker a snippet started with them); the shared-memory objects of every data
  directory the blocks made are removed.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shmlog.server.broker import shared_memory_prefix
from shmlog.shm import shared_memory

REPOSITORY = Path(__file__).resolve().parents[2]
README = REPOSITORY / "README.md"
RUNNABLE = ("sh", "python")
# A cold run compiles the kernels (a minute or two on two cores) and starts a JVM.
BLOCK_TIMEOUT_S = 600
TOTAL_TIMEOUT_S = 1500
SETUP_COMMANDS = ["make demo", "make test"]
# How often a waiting block looks whether the shell has exited.
SHELL_POLL_S = 0.5
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def readme_blocks() -> list[tuple[str, str]]:
    """(tag, text) of every fenced block of README.md, in order."""
    return [(tag.strip(), text) for tag, text in FENCE.findall(README.read_text())]


def runnable_blocks() -> list[tuple[str, str]]:
    """The blocks to run: tagged sh or python, the opening set-up block left out."""
    blocks = readme_blocks()
    unknown = sorted({tag for tag, _ in blocks if tag and tag not in RUNNABLE})
    assert not unknown, (f"README.md has blocks tagged {unknown}: tag commands 'sh' or "
                         f"'python' (they are run), or leave a block untagged (not run)")
    runnable = [(tag, text) for tag, text in blocks if tag in RUNNABLE]
    assert runnable, "README.md has no sh or python blocks: nothing shows how to use shmlog"
    setup_tag, setup = runnable[0]
    commands = [line.split("#")[0].strip() for line in setup.splitlines() if line.strip()]
    assert setup_tag == "sh" and commands == SETUP_COMMANDS, (
        f"README.md must open with the set-up block {SETUP_COMMANDS}, got {setup!r}")
    assert len(runnable) > 1, "README.md shows nothing to run after the set-up block"
    return runnable[1:]


class Shell:
    """One bash session fed block after block, as a terminal is."""

    def __init__(self, cwd: Path, env: dict, blocks: Path):
        self.blocks = blocks
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.output: list[str] = []
        self._lines: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._send("set -e -o pipefail\n")

    def _pump(self) -> None:
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, text: str) -> None:
        self.process.stdin.write(text)
        self.process.stdin.flush()

    def run(self, number: int, text: str, timeout_s: float) -> None:
        script = self.blocks / f"block-{number}.sh"
        script.write_text(text)
        done = f"@@ block {number} done @@"
        self._send(f"source {script} < /dev/null\necho '{done}'\n")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=SHELL_POLL_S)
            except queue.Empty:
                # A background job (the broker) may hold the output open after the
                # shell exited (set -e), so the exit is looked for, not waited for.
                if self.process.poll() is not None:
                    pytest.fail(f"sh block {number} failed (the shell exited with "
                                f"{self.process.returncode}):\n{text}\n--- output ---\n"
                                f"{self.tail()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"sh block {number} did not finish within {timeout_s:.0f} "
                                f"s:\n{text}\n--- output ---\n{self.tail()}")
                continue
            if line is None or line.rstrip("\n") == done:
                assert line is not None, f"sh block {number}: the shell ended:\n{self.tail()}"
                return
            self.output.append(line)

    def tail(self) -> str:
        return "".join(self.output)[-6000:]


def run_python(number: int, text: str, cwd: Path, env: dict, blocks: Path,
               timeout_s: float, groups: list[int]) -> None:
    script = blocks / f"block-{number}.py"
    script.write_text(text)
    process = subprocess.Popen([sys.executable, str(script)], cwd=cwd, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    groups.append(process.pid)
    try:
        output = process.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        pytest.fail(f"python block {number} did not finish within {timeout_s:.0f} s:\n{text}")
    assert process.returncode == 0, (f"python block {number} failed:\n{text}\n--- output ---\n"
                                     f"{output[-6000:]}")


def kill_groups(groups: list[int]) -> None:
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_shared_memory(work: Path) -> None:
    prefixes = [shared_memory_prefix(str(path)) for path in work.iterdir() if path.is_dir()]
    for name in os.listdir("/dev/shm"):
        if name.startswith(tuple(prefixes)):
            shared_memory.unlink(name)


@pytest.mark.timeout(TOTAL_TIMEOUT_S + 120)
def test_every_readme_block_runs_in_order(short_tmp_path):
    assert sys.prefix != sys.base_prefix, \
        "run the suite from the project's virtual environment (make test)"
    blocks = runnable_blocks()
    work, scripts = short_tmp_path / "work", short_tmp_path / "blocks"
    work.mkdir()
    scripts.mkdir()
    (work / ".venv").symlink_to(sys.prefix)
    (REPOSITORY / ".cache").mkdir(exist_ok=True)
    (work / ".cache").symlink_to(REPOSITORY / ".cache")
    env = {**os.environ, "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    groups: list[int] = []
    shell = None
    started = time.monotonic()
    try:
        shell = Shell(work, env, scripts)
        groups.append(shell.process.pid)
        for number, (tag, text) in enumerate(blocks, start=1):
            left = TOTAL_TIMEOUT_S - (time.monotonic() - started)
            assert left > 0, f"the README's blocks took longer than {TOTAL_TIMEOUT_S} s in all"
            block_started = time.monotonic()
            if tag == "sh":
                shell.run(number, text, min(BLOCK_TIMEOUT_S, left))
            else:
                run_python(number, text, work, env, scripts, min(BLOCK_TIMEOUT_S, left), groups)
            print(f"README block {number} ({tag}, {text.splitlines()[0][:50]!r}): "
                  f"{time.monotonic() - block_started:.1f} s")     # seen with -s
    finally:
        kill_groups(groups)
        if shell is not None:
            shell.process.wait(timeout=30)
        remove_shared_memory(work)


def test_blocks_are_found_and_the_setup_block_is_recognised():
    blocks = runnable_blocks()
    assert {tag for tag, _ in blocks} == set(RUNNABLE)


def test_the_docs_point_only_inside_the_repository():
    """The project stands alone: every relative link of README.md and docs/ names a
    file of the repository, and no file refers to the team's notes outside it."""
    documents = [README, *sorted((REPOSITORY / "docs").glob("*.md"))]
    assert len(documents) > 1, "docs/ARCHITECTURE.md is missing"
    for document in documents:
        for target in re.findall(r"\]\(([^)#\s]+)", document.read_text()):
            if "://" in target:
                continue
            path = (document.parent / target).resolve()
            assert path.is_relative_to(REPOSITORY) and path.exists(), \
                f"{document.name} links to {target}, which is not a file of the repository"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPOSITORY, capture_output=True,
                             text=True, timeout=60)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: no list of the project's files")
    notes = b"../" + b"shared"            # spelt in two so this file does not name it
    outside = [name for name in tracked.stdout.splitlines()
               if (REPOSITORY / name).is_file() and notes in (REPOSITORY / name).read_bytes()]
    assert not outside, f"these files refer to {notes.decode()}, outside the repository: {outside}"
