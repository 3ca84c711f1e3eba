"""How a controller's ZooKeeper writes are cut into multi-ops that fit ZooKeeper's
request size (``shmlog.cluster.zk.session.chunk_ops``, sans-I/O): in order, every op
once, no run above the size (but an op too large alone), room kept for the fence
every run gets, and one run when everything fits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shmlog.cluster.zk.session import CheckOp, CreateOp, DeleteOp, SetDataOp, chunk_ops, op_size
from shmlog.common import limits

FENCE = CheckOp("/controller_epoch", 7)


def state_op(partition: int, body_size: int = 80) -> SetDataOp:
    return SetDataOp(f"/brokers/topics/t/partitions/{partition}/state", b"x" * body_size, 3)


def test_an_op_counts_its_path_its_body_and_its_overhead():
    op = SetDataOp("/a/b", b"12345", 0)
    assert op_size(op) == 4 + 5 + limits.ZOOKEEPER_MULTI_OP_OVERHEAD_SIZE
    assert op_size(DeleteOp("/a")) == 2 + limits.ZOOKEEPER_MULTI_OP_OVERHEAD_SIZE


def test_no_ops_make_no_runs_and_a_few_make_one():
    assert chunk_ops([]) == []
    ops = [state_op(partition) for partition in range(10)]
    assert chunk_ops(ops) == [ops]


def test_ten_thousand_partition_states_go_in_a_few_runs_under_the_size():
    # issue 26: one topic of 10,000 partitions elected in one controller pass.
    ops = [state_op(partition) for partition in range(10_000)]
    runs = chunk_ops(ops, reserved=op_size(FENCE))
    assert [op for run in runs for op in run] == ops
    assert 1 < len(runs) < 10
    for run in runs:
        assert sum(op_size(op) for op in run) + op_size(FENCE) <= limits.ZOOKEEPER_MULTI_SIZE_MAX


def test_an_op_too_large_alone_is_a_run_of_its_own():
    big = CreateOp("/big", b"x" * 2000)
    ops = [state_op(0), big, state_op(1)]
    assert chunk_ops(ops, size_max=1000) == [[ops[0]], [big], [ops[2]]]


@given(st.lists(st.integers(0, 3000), max_size=200), st.integers(200, 20_000),
       st.integers(0, 150))
def test_runs_keep_every_op_in_order_and_stay_under_the_size(bodies, size_max, reserved):
    ops = [SetDataOp(f"/p/{index}", b"x" * body, -1) for index, body in enumerate(bodies)]
    runs = chunk_ops(ops, size_max=size_max, reserved=reserved)
    assert [op for run in runs for op in run] == ops
    assert all(runs)
    for run in runs:
        assert len(run) == 1 or sum(op_size(op) for op in run) <= size_max - reserved
