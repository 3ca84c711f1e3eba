"""The host-pinned bulk reader: batch reads through a JVM data source (``jvm/``),
several times faster than ``format("shmlog")``, whose every row crosses from a
Python worker to the JVM.

Rules
-----
* The Java sources ship in the package (``shmlog/spark/jvm``); :func:`bulk_jar`
  compiles them with ``javac`` against this PySpark's jars on first use and caches
  the jar by a hash of the PySpark version and the sources, under
  ``$SHMLOG_CACHE_DIR`` (default ~/.cache/shmlog), saying so on stderr (a warning
  logged) as it starts; ``python -m shmlog.spark.compile_reader`` (``make``) does
  it ahead of any session.
* Where that cannot be done (no JDK, a compile error), a session still works with
  ``format("shmlog")``: :func:`session_settings` logs why once per process, and
  :func:`bulk_read` raises :class:`~shmlog.common.errors.BulkReaderUnavailableError` with
  that reason.
* The plan is made in Python (:func:`~shmlog.spark.source.plan_batch`, the same as
  ``format("shmlog")``'s) and handed to the JVM as JSON (:func:`bulk_plan`).
  Outside a cluster each range names its partition's directory and the host that
  stores it, which the task checks (a task elsewhere fails).
* In a cluster each range names the hosts of its in-sync replicas, Spark's preferred
  locations. A task reads its own host's broker's copy (``SHMLOG_SPARK_BOOTSTRAP``
  in the executor's environment, else ``bootstrap``: ``locality``'s rules) in
  place, once that copy's high watermark - read from the broker's state table in
  /dev/shm - covers the range (a bounded wait, ``limits.SPARK_REPLICA_WAIT_MS`` and
  ``SPARK_REPLICA_POLL_MS``, handed over in the plan); on a host of an in-sync
  replica that read is local, elsewhere it reads the observer's or out-of-sync
  follower's copy there and counts remote
  (``readLocality`` with ``includeReadLocality``). A host with no broker, or whose
  broker holds no copy, fails with an error naming the host and partition.
* In read_committed (``kafka.isolation.level``) the plan ends at the last stable
  offsets and says ``readCommitted``: the JVM reader leaves out every
  transactional batch of an aborted transaction (the partition's ``.txnindex``
  entries: producer id, first and last offset), and in a cluster waits for its
  copy's last stable offset (the state table row's word at byte 64) to cover the
  range.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import zipfile

import pyspark

from ..common import limits
from ..common.errors import BulkReaderUnavailableError, ShmlogError
from ..protocol.control_client import request
from ..shm.state import topic_key
from .options import ReadOptions
from .source import plan_batch

log = logging.getLogger(__name__)

__all__ = ["bulk_jar", "bulk_read", "bulk_plan", "session_settings", "BULK_SOURCE",
           "JVM_SOURCES"]

BULK_SOURCE = "io.shmlog.spark.BulkSource"
# Session settings: the bulk reader's class when the session has it, else why not.
BULK_SOURCE_SETTING = "spark.shmlog.bulkSource"
BULK_UNAVAILABLE_SETTING = "spark.shmlog.bulkUnavailable"
JVM_SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")


def bulk_jar() -> str:
    """The bulk reader's jar, compiled from the Java sources shipped in the package
    against this PySpark's jars on first use, and cached (by source hash) under
    ``$SHMLOG_CACHE_DIR`` (default ~/.cache/shmlog).

    Raises
    ------
    BulkReaderUnavailableError
        There is no ``javac`` (a JRE without a JDK), the sources are missing, or they
        do not compile against this PySpark; the message says which.
    """
    javac = (os.path.join(os.environ["JAVA_HOME"], "bin", "javac")
             if os.environ.get("JAVA_HOME") else shutil.which("javac"))
    if javac is None or not os.path.exists(javac):
        raise BulkReaderUnavailableError(
            f"no javac at {javac}" if javac else "no javac on PATH (a JRE without a JDK)")
    sources = sorted(os.path.join(root, name) for root, _, names in os.walk(JVM_SOURCES)
                     for name in names if name.endswith(".java"))
    if not sources:
        raise BulkReaderUnavailableError(f"no Java sources under {JVM_SOURCES}: this "
                                         f"installation of shmlog is incomplete")
    digest = hashlib.sha256(pyspark.__version__.encode())
    for path in sources:
        with open(path, "rb") as source:
            digest.update(source.read())
    cache = os.environ.get("SHMLOG_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shmlog")
    jar = os.path.join(cache, f"shmlog-bulk-{digest.hexdigest()[:16]}.jar")
    if os.path.exists(jar):
        return jar
    os.makedirs(cache, exist_ok=True)
    # At WARNING, so that it shows where logging is not set up (Python prints
    # warnings to stderr then): the first session otherwise stalls silently for the
    # compile, as the first make used to.
    log.warning("compiling the shmlog Spark bulk reader with %s into %s (once per "
                "PySpark version and shmlog release; some seconds)", javac, jar)
    with tempfile.TemporaryDirectory(dir=cache) as classes:
        classpath = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
        try:
            compiled = subprocess.run([javac, "-nowarn", "-d", classes, "-cp", classpath,
                                       *sources], capture_output=True, text=True)
        except OSError as error:
            raise BulkReaderUnavailableError(f"cannot run {javac}: {error}") from None
        if compiled.returncode != 0:
            raise BulkReaderUnavailableError(
                f"{javac} failed with status {compiled.returncode}:\n{compiled.stderr.strip()}")
        partial = jar + f".{os.getpid()}.tmp"
        with zipfile.ZipFile(partial, "w") as archive:
            for root, _, names in os.walk(classes):
                for name in names:
                    path = os.path.join(root, name)
                    archive.write(path, os.path.relpath(path, classes))
        os.replace(partial, jar)
    return jar


def bulk_read(spark, **options):
    """A batch read like ``spark.read.format("shmlog")`` (same options, same schema
    without headers) through the bulk reader: a JVM data source that reads the
    segments straight into Spark's columnar batches, only the columns the query
    uses, each task preferring - and checking - the host that stores its range.
    Needs a session from :func:`session` (which ships the reader's jar).

    Raises
    ------
    BulkReaderUnavailableError
        The session has no bulk reader (the message says why).
    ShmlogError
        Headers were asked for.
    """
    parsed = ReadOptions.parse(options)
    if parsed.include_headers:
        raise ShmlogError("the bulk reader has no headers column; use format('shmlog')")
    if BULK_SOURCE not in spark.conf.get(BULK_SOURCE_SETTING, ""):
        reason = spark.conf.get(BULK_UNAVAILABLE_SETTING, "") or \
            "the session was not made by shmlog.spark.session()"
        raise BulkReaderUnavailableError(
            f"this Spark session has no shmlog bulk reader ({reason}); read with "
            f"spark.read.format('shmlog') instead, or create the session with "
            f"shmlog.spark.session() on a machine with a JDK (javac)")
    return spark.read.format(BULK_SOURCE).option("plan", json.dumps(bulk_plan(parsed))) \
        .option("includeReadLocality", str(parsed.include_read_locality).lower()).load()


def bulk_plan(options: ReadOptions) -> list[dict]:
    """The ranges of a bulk read, as the JVM reader takes them (JSON-ready dicts).

    Each range names its partition (``topic``, ``partition``, ``start``, ``end``) and
    ``directory``, the partition's directory at ``bootstrap``. Outside a cluster it
    names ``host``, this host, which its task checks. In a cluster it names
    ``hosts``, the in-sync replicas' (Spark's preferred locations), ``relative``,
    the partition's directory under any broker's data directory, and ``topicKey``,
    its state-table key, and ``waitMs``/``pollMs`` (how long and how often it looks
    at that copy's high watermark): a task reads the copy of its own host's broker
    (``SHMLOG_SPARK_BOOTSTRAP``, else ``bootstrap``) below that copy's high
    watermark. ``readCommitted`` says to leave aborted transactions out (and, in a
    cluster, to wait for the copy's last stable offset instead).
    """
    metadata = request(options.bootstrap, "metadata")
    partitions = {(entry["name"], part["partition"]): (entry["topic_id"], part["directory"])
                  for entry in metadata["topics"] for part in entry["partitions"]}
    bootstrap = os.path.abspath(options.bootstrap)
    ranges = []
    for piece in plan_batch(options):
        topic_id, directory = partitions[(piece.topic, piece.partition)]
        entry = {"topic": piece.topic, "partition": piece.partition, "start": piece.start,
                 "end": piece.end, "directory": directory, "bootstrap": bootstrap,
                 "readCommitted": options.read_committed}
        if "brokers" in metadata:
            entry.update(hosts=list(piece.hosts), topicKey=topic_key(topic_id),
                         relative=os.path.relpath(directory, bootstrap),
                         waitMs=limits.SPARK_REPLICA_WAIT_MS,
                         pollMs=limits.SPARK_REPLICA_POLL_MS)
        else:
            entry["host"] = socket.gethostname()
        ranges.append(entry)
    return ranges


_jar_failure: list[BulkReaderUnavailableError] = []


def _jar_once() -> str:
    """:func:`bulk_jar`, but a failure is logged and remembered: it is tried (and
    explained) once per process, not on every session."""
    if _jar_failure:
        raise _jar_failure[0]
    try:
        return bulk_jar()
    except BulkReaderUnavailableError as error:
        log.warning("the shmlog bulk reader is unavailable, so bulk_read() will fail; "
                    "format('shmlog') works: %s", error)
        _jar_failure.append(error)
        raise


def session_settings(jars: str | None = None) -> dict[str, str]:
    """The settings that give a new session the bulk reader: its jar added to
    ``jars`` (a session's own ``spark.jars``) and its class; or, when the jar cannot
    be had, why not (logged once per process), for :func:`bulk_read` to say."""
    try:
        jar = _jar_once()
    except BulkReaderUnavailableError as error:
        settings = {BULK_UNAVAILABLE_SETTING: str(error).splitlines()[0]}
        if jars is not None:
            settings["spark.jars"] = jars
        return settings
    return {"spark.jars": ",".join(filter(None, [jars, jar])),
            BULK_SOURCE_SETTING: BULK_SOURCE}
