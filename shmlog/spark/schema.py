"""The columns of a shmlog read: Spark's Kafka schema, and the Arrow batches that
carry it from a task to Spark.

Rules
-----
* The schema is Spark's Kafka source's (``key``, ``value``, ``topic``,
  ``partition``, ``offset``, ``timestamp``, ``timestampType``, and ``headers`` with
  ``includeHeaders``), so code written for Kafka ports by changing the format name.
* ``includeReadLocality`` adds ``readLocality`` (a string, after ``headers``): how
  the row's task read it, ``local`` or ``remote`` (``locality.ReadLocality``).
* No per-record Python: keys, values and header fields are gathered into Arrow's
  binary layout by a compiled kernel (``records.gather_fields``); the other columns
  are numpy arrays handed to Arrow as they are.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..record.records import RecordColumns, gather_fields

__all__ = ["SCHEMA", "SCHEMA_WITH_HEADERS", "HEADERS_TYPE", "READ_LOCALITY_FIELD", "to_arrow",
           "read_schema", "with_read_locality"]

SCHEMA = StructType([
    StructField("key", BinaryType()), StructField("value", BinaryType()),
    StructField("topic", StringType()), StructField("partition", IntegerType()),
    StructField("offset", LongType()), StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType())])
HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()),
                                     StructField("value", BinaryType())]))
SCHEMA_WITH_HEADERS = StructType(SCHEMA.fields + [StructField("headers", HEADERS_TYPE)])
READ_LOCALITY_FIELD = "readLocality"


def read_schema(include_headers: bool, include_read_locality: bool) -> StructType:
    """The schema of a read with these options."""
    fields = (SCHEMA_WITH_HEADERS if include_headers else SCHEMA).fields
    if include_read_locality:
        fields = fields + [StructField(READ_LOCALITY_FIELD, StringType())]
    return StructType(fields)

_ARROW_HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
_ARROW_FIELDS = [("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                 ("partition", pa.int32()), ("offset", pa.int64()),
                 ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32())]
_ARROW_SCHEMA = pa.schema(_ARROW_FIELDS)
_ARROW_SCHEMA_WITH_HEADERS = pa.schema(_ARROW_FIELDS + [("headers", pa.list_(_ARROW_HEADER))])


def _binary(data: np.ndarray, positions: np.ndarray, lengths: np.ndarray,
            arrow_type=pa.binary()) -> pa.Array:
    """One Arrow binary (or string) column from fields of ``data``: a compiled gather."""
    count = lengths.size
    offsets = np.empty(count + 1, np.int32)
    out = np.empty(int(np.maximum(lengths, 0).sum()), np.uint8)
    gather_fields(data, positions, lengths, offsets, out)
    nulls = lengths < 0
    null_count = int(nulls.sum())
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if null_count else None
    return pa.Array.from_buffers(arrow_type, count, [validity, pa.py_buffer(offsets),
                                                     pa.py_buffer(out)], null_count)


def _headers(columns: RecordColumns) -> pa.Array:
    counts = columns.header_counts.astype(np.int64)
    list_offsets = np.zeros(counts.size + 1, np.int32)
    np.cumsum(counts, out=list_offsets[1:])
    # Entry indexes of every record's headers, in record order.
    entries = (np.repeat(columns.header_starts - list_offsets[:-1], counts)
               + np.arange(int(list_offsets[-1])))
    keys = _binary(columns.data, columns.header_key_positions[entries],
                   columns.header_key_lengths[entries], pa.string())
    values = _binary(columns.data, columns.header_value_positions[entries],
                     columns.header_value_lengths[entries])
    entries_array = pa.StructArray.from_arrays([keys, values], fields=list(_ARROW_HEADER))
    return pa.ListArray.from_arrays(pa.array(list_offsets), entries_array,
                                    type=pa.list_(_ARROW_HEADER))


def to_arrow(columns: RecordColumns, topic: str, partition: int,
             include_headers: bool = False) -> pa.RecordBatch:
    """Records as an Arrow batch with Spark's Kafka schema."""
    count = len(columns)
    name = topic.encode()
    arrays = [
        _binary(columns.data, columns.key_positions, columns.key_lengths),
        _binary(columns.data, columns.value_positions, columns.value_lengths),
        pa.Array.from_buffers(pa.string(), count, [
            None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * len(name)),
            pa.py_buffer(name * count)]),
        pa.array(np.full(count, partition, np.int32)),
        pa.array(columns.offsets),
        pa.array(columns.timestamps * 1000, pa.timestamp("us", tz="UTC")),
        pa.array(columns.timestamp_types.astype(np.int32)),
    ]
    if include_headers:
        arrays.append(_headers(columns))
    return pa.RecordBatch.from_arrays(
        arrays, schema=_ARROW_SCHEMA_WITH_HEADERS if include_headers else _ARROW_SCHEMA)


def with_read_locality(batch: pa.RecordBatch, locality: str) -> pa.RecordBatch:
    """``batch`` with the ``readLocality`` column: ``locality`` on every row."""
    name = locality.encode()
    count = batch.num_rows
    column = pa.Array.from_buffers(pa.string(), count, [
        None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * len(name)),
        pa.py_buffer(name * count)])
    return batch.append_column(READ_LOCALITY_FIELD, column)
