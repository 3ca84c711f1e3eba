"""The high-watermark checkpoint of a cluster member (Kafka's
``replication-offset-checkpoint``): where each replicated partition's high watermark
stood, so a restarted replica shows its local readers only what was committed.

Rules
-----
* One file in the data directory, ``replication-offset-checkpoint.json``:
  ``{"<topic>/<partition>": high_watermark}``, replaced whole
  (``durable_files.write_atomically``), every
  ``replica.high.watermark.checkpoint.interval.ms`` and at a clean stop (Kafka's
  ``ReplicaManager.checkpointHighWatermarks``), and when the set of replicated
  partitions grows (so a partition hosted moments before a crash has an entry).
* **At hosting**, a replicated partition's high watermark starts at
  ``min(checkpoint, log end)``, or at its log start when the checkpoint has no entry
  for it (Kafka's ``Partition.createLogIfNotExists``: the checkpointed HW, else 0,
  kept within the log by ``Log.updateHighWatermark``). Without it a restarted
  follower would publish its log end, and its readers could see records the new
  leader never had, which its truncation then removes.
* **Never used for truncation** (KIP-101): it decides only how soon readers of a
  restarted replica see data. A stale, lower value is therefore always safe, and a
  file that cannot be read is ignored with a warning (every partition starts at its
  log start) rather than refusing to start, as Kafka does.
* The checkpoint is only ever written with high watermarks the loop published, and
  by one writer at a time in the order taken: the file never goes back to an older
  snapshot.

Theory of operation
-------------------
The loop takes a snapshot (a dict of ints, microseconds) and hands it to
:class:`HighWatermarkCheckpoint`'s single writer thread, so the write's fsync
(~1 ms, several under load) never stalls the broker loop (and acks=all latency); a
snapshot that equals the last one written is skipped. :meth:`close` waits for the
writer and writes the final snapshot itself.
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor

from ...common.errors import ShmlogError
from ...storage.durable_files import write_atomically

log = logging.getLogger("shmlog.broker")

__all__ = ["CHECKPOINT_FILE", "HighWatermarkCheckpoint", "read_checkpoint",
           "start_high_watermark"]

CHECKPOINT_FILE = "replication-offset-checkpoint.json"


def _name(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def read_checkpoint(path: str) -> dict[tuple[str, int], int]:
    """The high watermarks checkpointed in ``path``, {(topic, partition): hw}; empty
    when there is no file, or it cannot be read (logged: a lower start is safe)."""
    try:
        with open(path) as source:
            body = json.load(source)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        log.warning("ignoring %s (%s): replicas start at their log start", path, error)
        return {}
    if not isinstance(body, dict):
        log.warning("ignoring %s: not an object", path)
        return {}
    found = {}
    for name, high_watermark in body.items():
        topic, _, partition = name.rpartition("/")
        if topic and partition.isdigit() and isinstance(high_watermark, int) \
                and not isinstance(high_watermark, bool) and high_watermark >= 0:
            found[(topic, int(partition))] = high_watermark
        else:
            log.warning("%s: ignoring the entry %r: %r", path, name, high_watermark)
    return found


def start_high_watermark(checkpointed: int | None, log_start_offset: int,
                         log_end_offset: int) -> int:
    """A replica's high watermark when it is hosted: the checkpointed one kept
    within [log start, log end], or the log start without one."""
    if checkpointed is None:
        return log_start_offset
    return max(log_start_offset, min(checkpointed, log_end_offset))


class HighWatermarkCheckpoint:
    """The checkpoint file of the data directory ``data_dir`` (see the module's rules).

    Attributes
    ----------
    path : str
    checkpointed : dict
        {(topic, partition): hw} as read when made (the previous run's).
    """

    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, CHECKPOINT_FILE)
        self.checkpointed = read_checkpoint(self.path)
        self._written = dict(self.checkpointed)      # on the writer thread only
        self._writer = ThreadPoolExecutor(max_workers=1,
                                          thread_name_prefix="shmlog-hw-checkpoint")

    def start(self, topic: str, partition: int, log_start_offset: int,
              log_end_offset: int) -> int:
        """The high watermark (topic, partition) starts at when hosted."""
        return start_high_watermark(self.checkpointed.get((topic, partition)),
                                    log_start_offset, log_end_offset)

    def write_soon(self, high_watermarks: dict[tuple[str, int], int]) -> None:
        """Checkpoint ``high_watermarks`` on the writer thread (returns at once)."""
        self._writer.submit(self._write, dict(high_watermarks))

    def close(self, high_watermarks: dict[tuple[str, int], int]) -> None:
        """Wait for the writer, then checkpoint ``high_watermarks`` (a clean stop)."""
        self._writer.shutdown(wait=True)
        self._write(high_watermarks)

    def _write(self, high_watermarks: dict[tuple[str, int], int]) -> None:
        if high_watermarks == self._written:
            return
        body = {_name(topic, partition): int(high_watermark)
                for (topic, partition), high_watermark in sorted(high_watermarks.items())}
        try:
            write_atomically(self.path, json.dumps(body, sort_keys=True))
        except ShmlogError as error:     # a stale checkpoint is safe: log, try next time
            log.warning("cannot checkpoint high watermarks: %s", error)
            return
        self._written = dict(high_watermarks)
