"""The logging handler (``shmlog.LogHandler``): what one logging call costs the
application, how fast records reach the broker, and what a flood drops, next to
logging's own handlers in the same run.

Goal
----
Say what a ``logger.info(...)`` through ``LogHandler`` costs the calling thread,
against two bounds measured in the same process with the same logger, record and
Formatter: ``logging.NullHandler`` (logging's own work: the level check, the
LogRecord, the handler's lock; nothing formatted) and a ``StreamHandler`` writing to
/dev/null (the record formatted and written, a write per record). The handler's
calling-thread work is a format and a buffer append, so it should sit between the
two; its shipping thread's sends share the GIL with the caller, which the delivered
rate shows. A benchmark never asserts.

Method
------
1. A broker (``shmlog.Broker``, a child process) on a fresh data directory, a topic
   of one partition.
2. Every figure logs ``--records`` records ``logger.info("request %d served in %.3f
   ms", n, x)`` from one thread, Formatter ``"%(asctime)s %(levelname)s %(name)s
   %(message)s"``; a logging call's rate is records over the loop's time; a
   LogHandler's delivered rate is records over the loop plus ``flush()`` (acknowledged
   by the broker). The best of ``--repeats`` rounds is kept.
3. Bounds: NullHandler, StreamHandler to /dev/null.
4. LogHandler with the default buffer (10,000 records, overflow="drop"): calls/s,
   delivered/s, drops.
5. A flood: the same loop into a buffer of ``--flood-buffer`` records, with
   overflow="drop" (calls/s and the records dropped) and overflow="block" (calls/s
   and delivered/s: nothing may drop).
6. ``--threads`` threads logging at once into one default LogHandler: calls/s of
   all, drops.

Figures
-------
See the report printed at the end; the lead's notes keep the figures of a run with
the load average it had (2 cores, shared).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time

import harness  # noqa: F401  (this checkout's shmlog, numba's cache)

RECORDS_DEFAULT = 200_000
REPEATS_DEFAULT = 3
FLOOD_BUFFER_DEFAULT = 1_000
THREADS_DEFAULT = 4
TOPIC = "bench-logs"
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def log_loop(logger: logging.Logger, records: int) -> float:
    """Seconds to log ``records`` records from this thread."""
    info = logger.info
    started = time.perf_counter()
    for number in range(records):
        info("request %d served in %.3f ms", number, number * 0.001)
    return time.perf_counter() - started


def with_handler(handler: logging.Handler, name: str) -> logging.Logger:
    handler.setFormatter(logging.Formatter(FORMAT))
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def best(rounds: list[dict], key: str) -> dict:
    return max(rounds, key=lambda figures: figures[key])


def bound(make, name: str, records: int, repeats: int) -> float:
    """The best calls/s of ``repeats`` rounds into the handler ``make()`` returns."""
    rates = []
    for round_number in range(repeats):
        handler = make()
        seconds = log_loop(with_handler(handler, f"{name}-{round_number}"), records)
        handler.close()
        rates.append(records / seconds)
    return max(rates)


def shipped(data_dir: str, name: str, records: int, **options) -> dict:
    """One round into a LogHandler: calls/s, delivered/s (through flush), drops."""
    from shmlog import LogHandler
    handler = LogHandler(TOPIC, data_dir, **options)
    logger = with_handler(handler, name)
    started = time.perf_counter()
    seconds = log_loop(logger, records)
    handler.flush()
    delivered_s = time.perf_counter() - started
    handler.close()
    return {"calls_per_s": records / seconds, "delivered_per_s":
            (records - handler.dropped) / delivered_s, "dropped": handler.dropped,
            "failed": handler.failed}


def threaded(data_dir: str, records: int, threads: int) -> dict:
    """``threads`` threads, ``records`` each, into one LogHandler."""
    from shmlog import LogHandler
    handler = LogHandler(TOPIC, data_dir)
    logger = with_handler(handler, "threads")
    workers = [threading.Thread(target=log_loop, args=(logger, records)) for _ in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - started
    handler.flush()
    handler.close()
    return {"calls_per_s": threads * records / seconds, "dropped": handler.dropped,
            "failed": handler.failed}


def measure(data_dir: str, records: int, repeats: int, flood_buffer: int,
            threads: int) -> dict:
    null = bound(logging.NullHandler, "null", records, repeats)
    devnull = open(os.devnull, "w")
    try:
        stream = bound(lambda: logging.StreamHandler(devnull), "stream", records, repeats)
    finally:
        devnull.close()
    rounds = {
        "default": [shipped(data_dir, f"default-{n}", records) for n in range(repeats)],
        "flood_drop": [shipped(data_dir, f"drop-{n}", records, buffer_records=flood_buffer)
                       for n in range(repeats)],
        "flood_block": [shipped(data_dir, f"block-{n}", records, buffer_records=flood_buffer,
                                overflow="block") for n in range(repeats)],
    }
    figures = {name: best(runs, "calls_per_s") for name, runs in rounds.items()}
    figures["threads"] = threaded(data_dir, records // threads, threads)
    return {"null_per_s": null, "stream_per_s": stream, **figures}


def report(results: dict, records: int, flood_buffer: int, threads: int) -> None:
    null, stream = results["null_per_s"], results["stream_per_s"]
    print(f"{records} records per figure; rates in records/s; ratios to NullHandler and to "
          f"StreamHandler(/dev/null) of this run")
    print(f"{'figure':<44} {'calls/s':>10} {'/null':>6} {'/stream':>8} {'delivered/s':>12} "
          f"{'dropped':>8}")
    print(f"{'bound: NullHandler':<44} {null:10.0f} {1:6.2f} {null / stream:8.2f}")
    print(f"{'bound: StreamHandler(/dev/null)':<44} {stream:10.0f} {stream / null:6.2f} "
          f"{1:8.2f}")
    lines = (("default", "LogHandler, buffer 10,000, drop"),
             ("flood_drop", f"flood: buffer {flood_buffer:,}, overflow=drop"),
             ("flood_block", f"flood: buffer {flood_buffer:,}, overflow=block"),
             ("threads", f"{threads} threads, buffer 10,000, drop"))
    for key, name in lines:
        figure = results[key]
        delivered = figure.get("delivered_per_s")
        delivered = f"{delivered:12.0f}" if delivered is not None else f"{'-':>12}"
        print(f"{name:<44} {figure['calls_per_s']:10.0f} {figure['calls_per_s'] / null:6.2f} "
              f"{figure['calls_per_s'] / stream:8.2f} {delivered} {figure['dropped']:8d}"
              + (f"  ({figure['failed']} failed)" if figure["failed"] else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=RECORDS_DEFAULT)
    parser.add_argument("--repeats", type=int, default=REPEATS_DEFAULT)
    parser.add_argument("--flood-buffer", type=int, default=FLOOD_BUFFER_DEFAULT)
    parser.add_argument("--threads", type=int, default=THREADS_DEFAULT)
    arguments = parser.parse_args(argv)
    harness.unwind_on_sigterm()
    from bench_clients import remove_data

    from shmlog import Admin, Broker
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores",
          flush=True)
    data_dir = tempfile.mkdtemp(prefix="shmlog-bench-log-handler-")
    try:
        with Broker(data_dir):
            Admin(data_dir).create_topic(TOPIC, 1)
            results = measure(data_dir, arguments.records, arguments.repeats,
                              arguments.flood_buffer, arguments.threads)
    finally:
        remove_data(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
    report(results, arguments.records, arguments.flood_buffer, arguments.threads)
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
