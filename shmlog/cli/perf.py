"""``shmlog perf``: throughput and latency against a running broker (Kafka's
kafka-producer-perf-test, kafka-consumer-perf-test and end-to-end latency tool).

The measuring is ``shmlog.devtools.perf``'s (imported when the verb runs); this module
prints its results, and its progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from ..common import limits
from .exit_codes import EXIT_OK

__all__ = ["add_parser"]


def add_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``perf`` subcommand to ``commands`` (an argparse subparsers action)."""
    perf = commands.add_parser("perf", parents=parents,
                               help="throughput and latency tools (need a broker)")
    perf.add_argument("mode", choices=["produce", "consume", "e2e"])
    perf.add_argument("topic", help="partition 0 of this topic is used")
    perf.add_argument("--data-dir", help="the broker's data directory")
    perf.add_argument("--records", type=int, default=1_000_000)
    perf.add_argument("--record-size", type=int, default=100, help="bytes per value")
    perf.add_argument("--batch-records", type=int, default=0,
                      help="produce with send_batch of this many rows (0: one send each)")
    perf.add_argument("--acks", choices=["0", "1", "all"], default="1",
                      help="1 (default); all: once every in-sync replica has the record")
    perf.add_argument("--batch", action="store_true", help="consume with poll_batch")
    perf.add_argument("--timeout-ms", type=int, default=limits.PERF_IDLE_TIMEOUT_MS,
                      help="consume: stop after this long without a record (default "
                           f"{limits.PERF_IDLE_TIMEOUT_MS}, as Kafka's consumer perf test)")
    perf.add_argument("--rate", type=int, default=10_000, help="e2e: records per second")
    perf.add_argument("--seconds", type=float, default=5.0, help="e2e: how long")
    perf.add_argument("--json", action="store_true")
    perf.set_defaults(run=_perf)


def _perf(arguments) -> int:
    """Kafka-style perf tools against a running broker."""
    from ..devtools import perf

    def progress(done: int, elapsed: float) -> None:
        print(f"  {done:,} records in {elapsed:.1f} s ({done / elapsed:,.0f}/s)",
              file=sys.stderr, flush=True)

    if arguments.mode == "produce":
        result = perf.produce(arguments.data_dir, arguments.topic, arguments.records,
                              arguments.record_size, batch_records=arguments.batch_records,
                              acks=_acks(arguments.acks), progress=progress)
    elif arguments.mode == "consume":
        result = perf.consume(arguments.data_dir, arguments.topic, arguments.records,
                              batch=arguments.batch, timeout_ms=arguments.timeout_ms,
                              progress=progress)
    else:
        result = perf.end_to_end(arguments.data_dir, arguments.topic, arguments.rate,
                                 arguments.seconds, arguments.record_size)
    if arguments.json:
        print(json.dumps(result, indent=2))
    elif arguments.mode == "e2e":
        print(f"{result['records']:,} records at {result['rate']:,}/s: latency p50 "
              f"{result['p50_us']:.1f} us, p99 {result['p99_us']:.1f} us, p99.9 "
              f"{result['p999_us']:.1f} us, max {result['max_us']:.1f} us")
    else:
        print(f"{result['records']:,} records in {result['seconds']:.2f} s: "
              f"{result['records_per_s']:,.0f} records/s, {result['bytes_per_s'] / 1e6:,.1f} MB/s")
    return EXIT_OK


def _acks(text: str):
    """The --acks flag as the Producer takes it: 0, 1 or "all"."""
    return "all" if text == "all" else int(text)
