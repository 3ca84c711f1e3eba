"""Replication transport round trips: latency and FETCH_RESPONSE throughput.

Goal
----
Measure what ``zmq_replication.ReplicationEndpoint`` costs a follower's fetch: the
round trip of a small FETCH answered with an empty FETCH_RESPONSE (the floor under
acks=all's latency), and the rate of FETCH_RESPONSEs carrying 1 MiB of record
frames (the ceiling of a follower's catch-up through the transport alone).

Method
------
Two endpoints in this process over TCP on 127.0.0.1, each with its own ZeroMQ
context (its own I/O thread), as two brokers have; this thread pumps both, as a
broker's loop pumps its own (it sends the FETCH, waits on the leader's sockets,
replies, waits on the follower's). Records are a numpy
array sent zero-copy and received as a view of the frame. Latency: p50/p99 over
``--round-trips``; throughput: ``--fetches`` of 1 MiB, one in flight, then
``--in-flight`` at once. Prints the figures next to this host's memcpy; writes JSON
with ``--json``.

The cost of CurveZMQ (``--security both``, the default): the same figures once with
both endpoints on plain TCP and once with CURVE keys (each allowing the other's),
in one run, and each CURVE figure's ratio to plain TCP's. ``--security curve`` or
``plaintext`` measures one.

Measured on a quiet 2-vCPU VM (memcpy 20 GB/s), 2026-11-29, endpoints on the
owner's loop: round trip p50 221 us, p99 263 us (a bare pyzmq DEALER/ROUTER round
trip between two threads takes ~220 us there: what is left is libzmq's I/O thread
hops and TCP on loopback, not this code); 1 MiB responses at 2.6 GB/s one in
flight, 2.3 GB/s four in flight. With a socket thread per endpoint handing each
message to its owner (until then), under a load average of 2-4: p50 550-820 us,
p99 1.8-4.9 ms, 0.7-1.0 GB/s.

CurveZMQ's cost, the same run: round trips p50 x1.04, p99 x1.10; 1 MiB responses
0.94 GB/s one in flight (x0.36 of plain TCP), 1.19 GB/s four in flight (x0.51):
libzmq encrypts and authenticates every byte (XSalsa20-Poly1305) on the context's
one I/O thread, and copies each message into and out of the cipher. That bounds a
follower's catch-up through CurveZMQ; acks=all's latency, whose messages are small,
barely moves (``perf/bench_cluster.py --curve-cost``).
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np
import zmq
from bounds import memcpy_rate

from shmlog.cluster.replication.messages import (
    ErrorCode,
    Fetch,
    FetchPartition,
    FetchResponse,
    FetchResponsePartition,
)
from shmlog.zmq_replication import (
    CurveSecurity,
    ReceivedRequest,
    ReceivedResponse,
    ReplicationEndpoint,
)

RECORDS_SIZE = 1 << 20


SECURITIES = ("plaintext", "curve")


class Side:
    """One broker's endpoint, pumped as its loop would; a wait also pumps the other
    side (``peer``), whose request may wait in its endpoint for the connection."""

    def __init__(self, broker_id: int, security: CurveSecurity | None = None):
        self.endpoint = ReplicationEndpoint(broker_id, 1, "tcp://127.0.0.1:*", security)
        self.pending: list = []
        self.peer: Side | None = None

    def next(self, kind: type, timeout_s: float = 10.0):
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.pending:
                self.pending = self.endpoint.take()
            while self.pending:
                event = self.pending.pop(0)
                if isinstance(event, kind):
                    return event
                raise RuntimeError(f"unexpected event {event}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind.__name__}")
            if self.peer is not None:
                self.peer.endpoint.pump()
            self.endpoint.wait(0.001)


def fetch() -> Fetch:
    return Fetch(2, False, 500, 1, 10 << 20, (FetchPartition(123, 0, 1, 0, 0, RECORDS_SIZE),))


def round_trips(leader: Side, follower: Side, count: int, records) -> list[float]:
    entry = FetchResponsePartition(123, 0, ErrorCode.NONE, 10, 0, 10, records=records)
    times = []
    for _ in range(count):
        start = time.perf_counter()
        follower.endpoint.request(1, fetch(), 10_000)
        leader.endpoint.reply(leader.next(ReceivedRequest), FetchResponse((entry,)))
        follower.next(ReceivedResponse)
        times.append(time.perf_counter() - start)
    return times


def pipelined(leader: Side, follower: Side, count: int, in_flight: int, records) -> float:
    entry = FetchResponsePartition(123, 0, ErrorCode.NONE, 10, 0, 10, records=records)
    start = time.perf_counter()
    sent = answered = received = 0
    while received < count:
        while sent < count and sent - received < in_flight:
            follower.endpoint.request(1, fetch(), 10_000)
            sent += 1
        while answered < sent:
            leader.endpoint.reply(leader.next(ReceivedRequest), FetchResponse((entry,)))
            answered += 1
        follower.next(ReceivedResponse)
        received += 1
    return time.perf_counter() - start


def sides(security: str) -> tuple[Side, Side]:
    """A leader (broker 1) and a follower connected to it, on plain TCP or CURVE."""
    if security == "plaintext":
        leader, follower = Side(1), Side(2)
    else:
        pairs = [tuple(key.decode() for key in zmq.curve_keypair()) for _ in range(2)]
        allowed = frozenset(public for public, _ in pairs)
        leader, follower = (Side(broker_id, CurveSecurity(*pair, allowed))
                            for broker_id, pair in ((1, pairs[0]), (2, pairs[1])))
    follower.endpoint.set_peers({1: leader.endpoint.address}, {1: leader.endpoint.public_key})
    leader.peer, follower.peer = follower, leader
    return leader, follower


def measure(args, security: str) -> dict:
    """The figures of one security mode."""
    leader, follower = sides(security)
    records = np.random.default_rng(0).integers(0, 256, RECORDS_SIZE, dtype=np.uint8)
    try:
        round_trips(leader, follower, 50, None)                     # connect, warm up
        latencies = np.array(round_trips(leader, follower, args.round_trips, None)) * 1e6
        one = round_trips(leader, follower, args.fetches, records)
        many = pipelined(leader, follower, args.fetches, args.in_flight, records)
    finally:
        follower.endpoint.close()
        leader.endpoint.close()
    return {
        "round_trip_us_p50": float(np.percentile(latencies, 50)),
        "round_trip_us_p99": float(np.percentile(latencies, 99)),
        "fetch_1mib_one_in_flight_gbps": args.fetches * RECORDS_SIZE / sum(one) / 1e9,
        "fetch_1mib_one_in_flight_us_p50": float(np.percentile(np.array(one) * 1e6, 50)),
        f"fetch_1mib_{args.in_flight}_in_flight_gbps": args.fetches * RECORDS_SIZE / many / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--fetches", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--security", choices=SECURITIES + ("both",), default="both",
                        help="plain TCP, CurveZMQ, or both and their ratio (default)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    chosen = SECURITIES if args.security == "both" else (args.security,)
    figures = {
        "host": platform.node(), "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(), "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(), "memcpy_gbps": memcpy_rate() / 1e9,
        **{security: measure(args, security) for security in chosen}}
    if len(chosen) == 2:
        figures["curve_over_plaintext"] = {name: value / figures["plaintext"][name]
                                           for name, value in figures["curve"].items()}
    for name, value in figures.items():
        if isinstance(value, dict):
            print(f"{name}:")
            for figure, number in value.items():
                print(f"  {figure:36} {number:.3f}")
        else:
            print(f"{name:38} {value:.2f}" if isinstance(value, float) else f"{name:38} {value}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(figures, file, indent=2)


if __name__ == "__main__":
    main()
