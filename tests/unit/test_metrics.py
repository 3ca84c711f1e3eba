"""The counters behind stats, the Prometheus endpoint and the clients' metrics():
a rate window's total and rate (its buckets fall off with time, a young window
divides by its age), a histogram's buckets (Prometheus' ``le``: a value on a bound
counts in that bound's bucket), and a client's flow counts per topic.

Method: plain numbers, the clock passed in; table-style where there is a table.
"""

from __future__ import annotations

import pytest

from shmlog.common.metrics import FlowCounts, Histogram, RateWindow

# (recordings as (time, amount), when the rate is read, the rate): a 10 s window of
# 1 s buckets made at t=0.
RATE_CASES = [
    ([], 5.0, 0.0),
    ([(0.5, 10)], 0.5, 10.0),                 # younger than a bucket: divided by one bucket
    ([(0.5, 10)], 2.0, 5.0),                  # a young window divides by its age
    ([(1.0, 10), (5.5, 30)], 10.0, 40 / 9.0),  # buckets 1-10 cover 1.0-10.0
    ([(1.0, 10), (5.5, 30)], 12.0, 30 / 9.0),  # the bucket of second 1 fell off
    ([(1.0, 10), (5.5, 30)], 30.0, 0.0),      # everything fell off
]


@pytest.mark.parametrize("recordings, read_at, rate", RATE_CASES)
def test_a_rate_is_what_the_window_holds_over_the_time_it_covers(recordings, read_at, rate):
    window = RateWindow(window_s=10, bucket_s=1, now=0.0)
    for when, amount in recordings:
        window.record(amount, when)
    assert window.rate(read_at) == pytest.approx(rate)
    assert window.total == sum(amount for _, amount in recordings)


def test_the_total_keeps_what_the_window_dropped():
    window = RateWindow(window_s=2, bucket_s=1, now=0.0)
    for second in range(100):
        window.record(3, second + 0.5)
    assert window.total == 300
    assert window.rate(99.5) == pytest.approx(6 / 1.5)   # buckets 98 and 99, from 98.0


def test_recordings_in_one_second_share_its_bucket():
    window = RateWindow(window_s=10, bucket_s=1, now=0.0)
    for tenth in range(10):
        window.record(1, 3.0 + tenth / 10)
    assert window.rate(10.0) == pytest.approx(10 / 9.0)     # buckets 1-10: 1.0-10.0


# (observed values, cumulative counts at bounds 1, 2, 5, then +Inf)
HISTOGRAM_CASES = [
    ([], [0, 0, 0, 0]),
    ([1.0], [1, 1, 1, 1]),                    # on a bound: in that bound's bucket (le)
    ([1.5, 2.0, 2.0001], [0, 2, 3, 3]),
    ([0.0, 7.0, 100.0], [1, 1, 1, 3]),        # above the last bound: only in +Inf
]


@pytest.mark.parametrize("values, cumulative", HISTOGRAM_CASES)
def test_a_histogram_counts_as_prometheus_does(values, cumulative):
    histogram = Histogram((1, 2, 5))
    for value in values:
        histogram.observe(value)
    assert [count for _, count in histogram.cumulative()] == cumulative
    assert histogram.count == len(values)
    assert histogram.sum == pytest.approx(sum(values))
    described = histogram.as_dict()
    assert described["buckets"][-1] == ["+Inf", len(values)]
    assert [bound for bound, _ in described["buckets"][:-1]] == [1.0, 2.0, 5.0]


def test_a_client_counts_each_batch_overall_and_per_topic():
    flow = FlowCounts()
    flow.record("a", 10, 300)
    flow.record("b", 5, 100)
    flow.record("a", 1, 30)
    flow.record_errors("b", 5)
    assert (flow.batches, flow.records.total, flow.bytes.total, flow.errors.total) == \
        (3, 16, 430, 5)
    records, size, errors = flow.topics["a"]
    assert (records.total, size.total, errors.total) == (11, 330, 0)
    assert flow.topics["b"][2].total == 5
    assert flow.records.rate() > 0
