"""``format("shmlog")``: the Python data source Spark is given, which hands out the
readers of ``source.py`` and the writers of ``sink.py``."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .options import ReadOptions, flag
from .schema import read_schema
from .sink import BatchWriter, StreamWriter
from .source import BatchReader, StreamReader

__all__ = ["ShmlogDataSource", "register"]


class ShmlogDataSource(DataSource):
    """``format("shmlog")``: see ``shmlog.spark``'s docstring for its options and columns."""

    @classmethod
    def name(cls) -> str:
        return "shmlog"

    def schema(self) -> StructType:
        return read_schema(flag(self.options, "includeHeaders", False),
                           flag(self.options, "includeReadLocality", False))

    def reader(self, schema: StructType) -> "BatchReader":
        return BatchReader(ReadOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> "StreamReader":
        return StreamReader(ReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> "BatchWriter":
        return BatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> "StreamWriter":
        return StreamWriter(self.options, schema)


def register(spark) -> None:
    """Make ``format("shmlog")`` available in a Spark session."""
    spark.dataSource.register(ShmlogDataSource)
