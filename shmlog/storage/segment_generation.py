"""The segment generation: a seqlock over a partition's set of segment files.

Readers in other processes map a partition's segment files; the broker adds,
removes and replaces them (roll, retention, truncation, a compaction swap). The
generation, published in the partition's row of the state table, tells a reader
when to list the directory again and whether a listing can be trusted. This
module holds both sides of that protocol; every other module only follows it.

Rules
-----
* The value is even while the set of files is stable and odd while a change that
  removes or replaces files is under way: from before its first file operation
  until after its last. Changes do not nest.
* The writer publishes the odd value, and the generation is visible to every core
  (a full fence), before the first file operation of a change; it publishes the
  even value after the last one, even when the change fails half-way
  (:meth:`SegmentGeneration.changing`).
* A change that only adds files at offsets no reader may read yet (a roll, which
  also seals the previous segment: readers learn of that through the published
  active segment) moves the value by two, keeping its parity, once it is done
  (:meth:`SegmentGeneration.rolled`).
* A reader trusts a listing of the directory only when it loaded the same even
  value before and after it (the second load after a full fence, see
  ``state.load_segment_generation``). Seeing an odd value, it does not list: a
  reader whose mappings are of the value just before reads on through them (a
  renamed-over or unlinked file stays valid while mapped, and the old segments
  hold every record); any other reader waits (:func:`follow`).

Theory of operation
-------------------
A listing torn by a change could hold some files of the old set and some of the
new. During a compaction swap, for example, a listing made after a group's
cleaned segment was renamed over its first segment and after the group's other
segments were deleted, but that read the directory entry of the first one before
the rename, would find the old first segment and none of the others, and a read
would step over offsets that only the cleaned copy holds. Every file operation
of a change happens after the odd value is visible and before the even one is
published (release), so a listing that saw any of them loads the odd value or a
later one on its second load, and lists again.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from ..common.errors import LocalProtocolError
from ..native.atomics import py_fence

__all__ = ["SegmentGeneration", "follow"]


class SegmentGeneration:
    """The writer's side: the generation of one partition's files, moved only
    through :meth:`changing` and :meth:`rolled`, so its parity cannot go wrong.

    Parameters
    ----------
    directory : str
        The partition's directory, for error messages.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self._value = 0

    @property
    def value(self) -> int:
        """The current generation (even: the set of files is stable)."""
        return self._value

    @property
    def changing_now(self) -> bool:
        """Whether a change of the files is under way (the value is odd)."""
        return self._value % 2 == 1

    def rolled(self) -> None:
        """A roll is done: files were added, none removed. By two, so a roll made
        inside a change (retention sealing an expired active segment) keeps it odd."""
        self._value += 2

    @contextlib.contextmanager
    def changing(self, publish: Callable[[], None]) -> Iterator[None]:
        """Bracket a change that removes or replaces files: odd and published (then a
        full fence) before the body runs, even and published after it, even when it
        raises.

        Parameters
        ----------
        publish : callable
            Publishes the current value where readers load it (the partition's row
            of the state table); called twice.

        Raises
        ------
        LocalProtocolError
            A change is already under way (changes do not nest); nothing moved.
        """
        if self.changing_now:
            raise LocalProtocolError(
                f"{self.directory}: a change of the segment files began while another "
                f"was under way (generation {self._value}); changes do not nest")
        self._value += 1
        self._publish(publish)
        try:
            yield
        finally:
            self._value += 1
            self._publish(publish)

    @staticmethod
    def _publish(publish: Callable[[], None]) -> None:
        publish()
        # The publishing store is a release, which orders what came before it, not
        # what follows. The full fence makes the odd value visible to every core
        # before the first rename or unlink starts, so a reader whose listing sees
        # any of them loads (after its own fence) this value or a later one.
        py_fence()


def follow(load: Callable[[], int], mapped: int | None, rescan: Callable[[], None],
           attempts_max: int) -> int | None:
    """The reader's side: bring a reader's mappings to a consistent set of files.

    Parameters
    ----------
    load : callable
        Loads the published generation (after a full fence, with acquire:
        ``PartitionStateTable.segment_generation``).
    mapped : int or None
        The generation the reader's mappings are of (None: not a trusted set).
    rescan : callable
        Lists the directory and maps what it holds (the mappings are then of no
        trusted generation until this function says which).
    attempts_max : int
        How many listings to try while the generation keeps moving.

    Returns
    -------
    int or None
        The generation the mappings are of and may be read through now (the
        one just before an odd published value, when the reader's mappings are of
        it), or None when there is none: a change is under way (or the value kept
        moving), and the reader returns nothing and comes back later.
    """
    generation = load()
    for _ in range(attempts_max):
        if generation == mapped:
            return mapped
        if generation % 2:
            return mapped if mapped == generation - 1 else None
        rescan()
        mapped = None
        listed, generation = generation, load()
        if generation == listed:
            return generation
    return None
