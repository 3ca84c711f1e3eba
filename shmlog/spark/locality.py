"""Where a Spark task reads a partition of a cluster, and whether that read is local
(plain values in, plain values out: no I/O).

Rules
-----
* **Each task reads through its own host's broker.** The broker is found by the
  task's environment: ``SHMLOG_SPARK_BOOTSTRAP`` (:data:`TASK_BOOTSTRAP_ENVIRONMENT`),
  the data directory of the broker on the executor's host, set per worker
  (``tools/spark_cluster.py --worker-bootstrap HOST=DIR``); without it a task uses
  the ``bootstrap`` option, as on a single host (:func:`task_bootstrap`).
* **A range prefers every host holding an in-sync replica** (:func:`preferred_hosts`):
  the leader's first, then the other ISR members' in ISR order, each broker by the
  host it registered (its advertised host, which is what Spark standalone workers on
  the broker hosts register with). Spark's Kafka source prefers one executor per
  partition by a hash (to reuse cached consumers): its brokers are remote, ours are
  the data, so replica hosts win here.
* **A read is local** when the task's broker is the partition's leader or an in-sync
  follower (:func:`read_locality`); an observer copy or an out-of-sync follower is
  read as well (every broker hosts every partition), once its high watermark covers
  the range, and counts as remote. A broker outside a cluster holds the only copy:
  local.
* **Where a task ran decides how its read counts** (:func:`placement_locality`):
  with one broker per host, a task that reads through its host's broker reads an
  in-sync replica exactly when its host is one of the range's preferred hosts, so
  :func:`read_locality`'s answer (by the broker's role) must equal this one (by the
  task's host). The JVM bulk reader counts by the host directly
  (``BulkSource.isLocal``); the pipeline tool (tools/spark_cluster_pipeline.py)
  checks every ``format("shmlog")`` task's answer against the host it ran on. Only
  that agreement is certain: Spark places the Python source's tasks at will (its
  Data Source API names no preferred hosts), so how many read locally is chance -
  with three single-core executors and three partitions of replication factor 2,
  every task lands on a host without an in-sync replica in 1 run of 6.
* **Every copy is read only below its own high watermark.** The plan's ends are
  the driver's broker's high watermarks (Kafka's ListOffsets asks the leader; the
  driver reaches only its own host's broker, whose copy's high watermark is never
  past the leader's, so every in-sync copy reaches it). Another host's copy may
  trail them: the task waits for it, bounded (``limits.SPARK_REPLICA_WAIT_MS``),
  and fails naming the host and partition.
"""

from __future__ import annotations

import enum
from typing import Mapping, Sequence

__all__ = ["ReadLocality", "TASK_BOOTSTRAP_ENVIRONMENT", "task_bootstrap", "preferred_hosts",
           "read_locality", "placement_locality", "partition_hosts"]

TASK_BOOTSTRAP_ENVIRONMENT = "SHMLOG_SPARK_BOOTSTRAP"


class ReadLocality(enum.Enum):
    """How a task read its range: from an in-sync replica on its own host, or not."""
    LOCAL = "local"            # the leader's or an in-sync follower's segments, in place
    REMOTE = "remote"          # an observer's or out-of-sync follower's copy of this host


def task_bootstrap(option_bootstrap: str, environment: Mapping[str, str]) -> str:
    """The data directory of the broker a task reads through: its host's
    (``SHMLOG_SPARK_BOOTSTRAP``), else the ``bootstrap`` option."""
    return environment.get(TASK_BOOTSTRAP_ENVIRONMENT) or option_bootstrap


def preferred_hosts(leader: int, isr: Sequence[int], hosts: Mapping[int, str]) -> list[str]:
    """The hosts of the in-sync replicas, the leader's first; a broker with no
    registration (not live) is left out, and a host named twice is named once."""
    preferred: list[str] = []
    for broker_id in [leader, *isr]:
        host = hosts.get(broker_id)
        if host is not None and host not in preferred:
            preferred.append(host)
    return preferred


def read_locality(broker_id: int | None, role: str | None, isr: Sequence[int]) -> ReadLocality:
    """Local for the leader, an in-sync follower, or a broker outside a cluster
    (``broker_id`` None: the only copy); remote otherwise."""
    if broker_id is None or role == "leader":
        return ReadLocality.LOCAL
    if role == "follower" and broker_id in isr:
        return ReadLocality.LOCAL
    return ReadLocality.REMOTE


def placement_locality(task_host: str, preferred: Sequence[str]) -> ReadLocality:
    """How the read of a task on ``task_host`` counts when it reads through that
    host's broker: local when the host is one of the range's ``preferred`` hosts
    (:func:`preferred_hosts`: the in-sync replicas'), remote otherwise."""
    return ReadLocality.LOCAL if task_host in preferred else ReadLocality.REMOTE


def partition_hosts(metadata: dict, descriptions: Mapping[str, dict]
                    ) -> dict[tuple[str, int], list[str]]:
    """Every described partition's preferred hosts, from a cluster member's
    ``metadata`` reply (its ``brokers``) and ``describe_topic`` replies by topic name;
    empty for a broker outside a cluster (no ``brokers``)."""
    brokers = metadata.get("brokers")
    if brokers is None:
        return {}
    hosts = {int(broker_id): entry["host"] for broker_id, entry in brokers.items()}
    return {(name, entry["partition"]): preferred_hosts(entry["leader"], entry["isr"], hosts)
            for name, described in descriptions.items()
            for entry in described["partitions"]}
