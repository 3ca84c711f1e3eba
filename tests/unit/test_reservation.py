"""The pace of a partition's reservations (``storage.reservation.ReservePace``): how
far ahead of its write position it keeps room, as its write rate changes. The clock
is passed in, so these are the rules alone, without a segment."""

from shmlog.common import limits
from shmlog.storage.reservation import ReservePace

MIN, MAX = limits.SEGMENT_RESERVE_AHEAD_MIN, limits.SEGMENT_RESERVE_AHEAD_MAX
HORIZON = limits.SEGMENT_RESERVE_HORIZON_S
DECAY = limits.SEGMENT_RESERVE_DECAY_S


def test_a_new_partition_keeps_the_least():
    assert ReservePace(now=0.0).settle(now=0.0) == MIN


def test_a_stall_doubles_the_distance_up_to_the_most():
    pace = ReservePace(now=0.0)
    pace.stalled(now=1.0)
    assert pace.settle(now=1.0) == 2 * MIN
    for _ in range(64):
        pace.stalled(now=1.0)
    assert pace.settle(now=1.0) == MAX


def test_a_steady_stream_is_reserved_for_the_horizon_at_its_rate():
    pace = ReservePace(now=0.0)
    rate = 2 << 20                                  # 2 MiB/s
    pace.prefaulting(now=1.0, position=0)
    pace.prefaulting(now=1.5, position=rate // 2)
    ahead = pace.settle(now=1.5)
    # A power of two of the least, the first to hold the horizon's bytes.
    assert ahead >= rate * HORIZON > ahead // 2
    assert ahead // MIN * MIN == ahead and (ahead // MIN) & (ahead // MIN - 1) == 0


def test_the_rate_never_takes_more_than_the_most():
    pace = ReservePace(now=0.0)
    pace.prefaulting(now=1.0, position=0)
    pace.prefaulting(now=1.001, position=64 << 20)  # 64 GiB/s
    assert pace.settle(now=1.001) == MAX


def test_a_slow_partition_stays_at_the_least():
    pace = ReservePace(now=0.0)
    pace.prefaulting(now=1.0, position=0)
    pace.prefaulting(now=11.0, position=MIN)        # 32 KiB in 10 s
    assert pace.settle(now=11.0) == MIN


def test_a_roll_between_samples_gives_no_rate():
    pace = ReservePace(now=0.0)
    pace.prefaulting(now=1.0, position=1 << 30)
    pace.prefaulting(now=1.001, position=4096)      # the next segment's start
    assert pace.settle(now=1.001) == MIN


def test_a_quiet_partition_halves_its_distance_each_decay_interval():
    pace = ReservePace(now=0.0)
    for _ in range(3):
        pace.stalled(now=0.0)
    assert pace.settle(now=DECAY - 0.001) == 8 * MIN
    assert pace.settle(now=DECAY) == 4 * MIN
    assert pace.settle(now=2 * DECAY) == 2 * MIN
    assert pace.settle(now=10 * DECAY) == MIN       # and never below the least
