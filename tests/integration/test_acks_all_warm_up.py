"""The broker's warm-up loads the kernels of acks=all's seams, so a replica service's
first acks=all produce, min.insync change or refusal of parked entries compiles
nothing with the GIL held.

Method: a fresh Python process (the same ``NUMBA_CACHE_DIR``) runs the broker's
``warm_kernels``, notes every kernel signature it has (``cold_start_child``'s
``kernel_signatures``), then drives the seams as a replica service would on a real
Appender of its own (real logs, a state table and a ring in /dev/shm) and reports
what it gained: nothing may be.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from helpers import unlink_shared_memory

REPLY_TIMEOUT_S = 600            # a cold numba cache compiles the broker for minutes
HERE = os.path.dirname(os.path.abspath(__file__))

CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[2])
    from cold_start_child import gained, kernel_signatures
    from shmlog import LogManager
    from shmlog.broker.appender import Appender, HighWatermarkPolicy
    from shmlog.server.broker import BrokerConfig, shared_memory_prefix, warm_kernels
    from shmlog.shm.completion import CompletionCode
    from shmlog.record.records import encode_batch
    from shmlog.ring import Ring
    from shmlog.shm.state import PartitionStateTable

    data_dir = sys.argv[1]
    warm_kernels(BrokerConfig(data_dir=data_dir))
    since = kernel_signatures()
    prefix = shared_memory_prefix(data_dir)
    logs = LogManager(data_dir)
    table = PartitionStateTable.create(prefix + "-state", 4)
    appender = Appender(logs, table)
    logs.create_topic("t")
    row = appender.register_partition("t", 0)
    appender.set_high_watermark_policy(row, HighWatermarkPolicy.EXTERNAL)
    producer = Ring.create(prefix + "-ring", 1 << 16)
    appender.add_ring(Ring.attach(producer.name), awaits_high_watermark=True)
    to = appender.destination("t", 0)
    for value in (b"a", b"b", b"c"):
        producer.put(to, encode_batch([value]), 1000)
    appender.drain()
    appender.parked_count(row)
    appender.set_under_min_isr(row, True)
    appender.advance_high_watermark(row, 1)
    appender.refuse_parked_from(row, 2, CompletionCode.NOT_LEADER_OR_FOLLOWER)
    appender.refuse_parked(row, CompletionCode.NOT_LEADER_OR_FOLLOWER)
    producer.put(to, encode_batch([b"d"]), 1000)
    appender.drain()
    loaded = gained(since)         # before the producer's side harvests its results
    results = [producer.result(entry) for entry in range(4)]
    print(json.dumps({"gained": loaded, "results": results}), flush=True)
    logs.close()
""")


def test_the_warm_up_loads_the_acks_all_seams(tmp_path):
    data_dir = str(tmp_path / "data")
    os.makedirs(data_dir)
    repository = os.path.dirname(os.path.dirname(HERE))
    try:
        finished = subprocess.run(
            [sys.executable, "-c", CHILD, data_dir, HERE], capture_output=True, text=True,
            timeout=REPLY_TIMEOUT_S, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [repository, os.environ.get("PYTHONPATH", "")])})
    finally:
        unlink_shared_memory(data_dir)
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.splitlines()[-1])
    not_leader = -109
    assert report["results"] == [[-108, -1], [not_leader, -1], [not_leader, -1], [-107, -1]], \
        "the seams ran: after, refused from 2, refused, before"
    assert report["gained"] == {}, f"loaded after the warm-up: {report['gained']}"
