"""The processes of ``test_cold_start.py``: a broker, a producer and a consumer, each
a fresh Python process that reports, as JSON lines on stdout, which compiled kernels
it loaded after it was ready to serve (the broker) or was constructed (the clients).

numba compiles a kernel, or loads it from its disk cache, at its first call for each
tuple of argument types, and adds that signature to the kernel's dispatcher: a
signature that appears after start is a kernel loaded, with the GIL held, inside
real work. Watched: every dispatcher in shmlog's modules, and numba's typed
containers' (their methods compile in every process: numba does not cache them).

Usage::

    cold_start_child.py broker DATA_DIR SETTINGS_JSON
        Serves until SIGTERM; prints {"ready": true, "compiled": [...]} once its control
        socket is bound (``compiled``: the functions numba compiled, rather than loaded
        from its disk cache, while the broker started),
        then, for each line read on stdin, {"gained": {...}}: what it loaded since.
    cold_start_child.py producer DATA_DIR TOPIC COUNT
        Prints {"ready": true} once its Producer is made; on a line on stdin sends
        COUNT records one at a time (acks=1, each value starts with the send time,
        CLOCK_MONOTONIC in ns), then prints {"gained": {...}}.
    cold_start_child.py consumer DATA_DIR TOPIC COUNT
        Prints {"ready": true} once its Consumer is made and has polled once (no records
        yet), polls until COUNT records came, then prints {"gained": {...},
        "latencies_us": [...]}: each record's send-to-poll latency, in order.
"""

from __future__ import annotations

import json
import struct
import sys
import threading
import time

from numba.core import compiler
from numba.core.registry import CPUDispatcher

WATCHED_MODULES = ("shmlog", "numba.typed")
TIMESTAMP = struct.Struct("<q")
VALUE_SIZE = 100
POLL_TIMEOUT_MS = 100
CONSUME_TIMEOUT_S = 60.0


def kernel_signatures() -> dict[str, set[str]]:
    """Every watched dispatcher (by its function's qualified name): the argument
    types it has loaded code for."""
    found: dict[str, set[str]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(WATCHED_MODULES):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, CPUDispatcher):
                function = value.py_func
                found[f"{function.__module__}.{function.__qualname__}"] = \
                    {str(signature) for signature in value.signatures}
    return found


def gained(before: dict[str, set[str]]) -> dict[str, list[str]]:
    """What was loaded since ``before``: {kernel: [argument types]}."""
    return {name: sorted(signatures - before.get(name, set()))
            for name, signatures in kernel_signatures().items()
            if signatures - before.get(name, set())}


def record_compiles() -> list[str]:
    """From now on, the qualified name of every function numba compiles (a cache
    miss: a load from the disk cache does not compile) is appended to the list."""
    compiled: list[str] = []
    compile_extra = compiler.compile_extra

    def recording(typingctx, targetctx, func, *arguments, **options):
        compiled.append(f"{func.__module__}.{func.__qualname__}")
        return compile_extra(typingctx, targetctx, func, *arguments, **options)

    compiler.compile_extra = recording
    return compiled


def report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def broker(data_dir: str, settings_json: str) -> None:
    compiled = record_compiles()
    from shmlog.server.broker import BrokerConfig, serve

    since: dict[str, set[str]] = {}

    def answer_questions() -> None:
        for _ in sys.stdin:
            report(gained=gained(since))

    def ready() -> None:
        since.update(kernel_signatures())
        threading.Thread(target=answer_questions, daemon=True).start()
        report(ready=True, compiled=sorted(set(compiled)))

    serve(BrokerConfig(data_dir=data_dir, **json.loads(settings_json)), ready=ready)


def producer(data_dir: str, topic: str, count: int) -> None:
    from shmlog import Producer

    with Producer(data_dir, acks=1, linger_ms=0) as client:
        since = kernel_signatures()
        report(ready=True)
        sys.stdin.readline()
        for _ in range(count):
            value = TIMESTAMP.pack(time.monotonic_ns()).ljust(VALUE_SIZE, b".")
            client.send(topic, value).get(timeout=CONSUME_TIMEOUT_S)
        report(gained=gained(since))


def consumer(data_dir: str, topic: str, count: int) -> None:
    from shmlog import Consumer

    with Consumer(topic, bootstrap=data_dir, auto_offset_reset="earliest") as client:
        since = kernel_signatures()
        client.poll(timeout_ms=0)               # assigned, and at the end of the empty topic
        report(ready=True)
        latencies_us = []
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        while len(latencies_us) < count and time.monotonic() < deadline:
            for records in client.poll(timeout_ms=POLL_TIMEOUT_MS).values():
                now = time.monotonic_ns()
                latencies_us += [(now - TIMESTAMP.unpack_from(record.value)[0]) / 1000
                                 for record in records]
        report(gained=gained(since), latencies_us=latencies_us)


if __name__ == "__main__":
    role, data_dir, *arguments = sys.argv[1:]
    if role == "broker":
        broker(data_dir, *arguments)
    else:
        {"producer": producer, "consumer": consumer}[role](data_dir, arguments[0],
                                                           int(arguments[1]))
