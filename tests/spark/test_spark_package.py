"""``shmlog.spark`` is a package whose face is the module it was: every name the
documented usage and the tools import is there, and ``format("shmlog")`` is the
data source the package registers.

Method: import the names in-process (no Spark session is started).
"""

from __future__ import annotations

import importlib

import pytest

# The names shmlog/spark.py had, which README.md, tools/, perf/ and tests import.
PUBLIC_NAMES = ("ShmlogDataSource", "register", "session", "bulk_read", "bulk_jar", "SCHEMA",
                "SCHEMA_WITH_HEADERS", "HEADERS_TYPE", "to_arrow", "OffsetRange", "plan",
                "plan_batch", "read_range", "write_batches", "WrittenRecords", "ReadOptions",
                "EARLIEST", "LATEST", "FETCH_BYTES", "STALL_TIMEOUT_MS",
                "MAX_RECORDS_PER_PARTITION_DEFAULT")


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_every_name_of_the_module_is_the_packages(name):
    spark = importlib.import_module("shmlog.spark")
    assert getattr(spark, name) is not None


def test_the_documented_usage_finds_the_functions():
    from shmlog import spark as shmlog_spark
    assert callable(shmlog_spark.session) and callable(shmlog_spark.register)
    assert shmlog_spark.ShmlogDataSource.name() == "shmlog"
    assert set(shmlog_spark.__all__) <= set(PUBLIC_NAMES)
