"""shmlog: a Kafka-style commit log for large single hosts.

With a broker running (``shmlog broker``, or ``Broker`` from Python)::

    from shmlog import Admin, Consumer, Producer

    Admin().create_topic("events", partitions=3)
    with Producer() as producer:
        producer.send("events", b"hello", key=b"user-1").get(timeout=10)
    with Consumer("events", auto_offset_reset="earliest") as consumer:
        for partition, records in consumer.poll(timeout_ms=1000).items():
            ...

The storage layer is usable on its own::

    from shmlog import LogManager, encode_batch, decode_records

    with LogManager("/var/lib/shmlog") as logs:
        logs.create_topic("events", partitions=3)
        partition = logs.partition_log("events", 0)
        partition.append(encode_batch([b"hello", b"world"], keys=[b"k1", None]))
        for record in decode_records(partition.read(0).data):
            print(record.offset, record.key, record.value)

Names are imported on first use (PEP 562), so ``import shmlog``, and the
``shmlog`` command's verbs that only ask the broker something (``topics``,
``groups``), load neither numba nor numpy; the error classes (a module that imports
nothing) are imported at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .common.errors import (
    BulkReaderUnavailableError,
    ClientClosedError,
    CommitFailedError,
    CorruptRecordError,
    CorruptRingError,
    CorruptSegmentError,
    GroupError,
    IllegalGenerationError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    LocalProtocolError,
    OffsetOutOfRangeError,
    OffsetOverflowError,
    PartitionNotAssignedError,
    PeerProtocolError,
    RebalanceInProgressError,
    RecordTooLargeError,
    RingFullError,
    ShmlogError,
    StorageError,
    TopicExistsError,
    UnknownMemberIdError,
    UnknownTopicOrPartitionError,
)

if TYPE_CHECKING:                    # what static analysers and IDEs see
    from .client.admin import Admin
    from .client.consumer import (
        Consumer,
        ConsumerRebalanceListener,
        ConsumerRecord,
        GroupMetadata,
        OffsetAndMetadata,
        OffsetAndTimestamp,
        TopicPartition,
    )
    from .client.log_handler import LogHandler
    from .client.producer import Producer
    from .client.producer_batch import BatchMetadata, RecordMetadata
    from .record.records import Record, RecordColumns, decode_columns, decode_records, encode_batch
    from .segments import AppendResult, PartitionLog, ReadResult, RecoveryReport
    from .server.broker import Broker
    from .storage.log_manager import DataDirectoryInUseError, LogManager, TopicMetadata
    from .storage.topic_config import TopicConfig

__version__ = "0.1.0"

__all__ = [
    "Producer", "Consumer", "Admin", "Broker", "LogHandler", "RecordMetadata", "BatchMetadata",
    "ConsumerRecord", "TopicPartition", "OffsetAndTimestamp", "OffsetAndMetadata",
    "ConsumerRebalanceListener", "GroupMetadata",
    "GroupError", "CommitFailedError", "PartitionNotAssignedError", "IllegalGenerationError",
    "RebalanceInProgressError", "UnknownMemberIdError",
    "TopicConfig", "LogManager", "TopicMetadata", "PartitionLog", "AppendResult", "ReadResult",
    "RecoveryReport", "Record", "RecordColumns", "encode_batch", "decode_records",
    "decode_columns",
    "ShmlogError", "LocalProtocolError", "PeerProtocolError", "InvalidTopicError",
    "InvalidPartitionsError", "InvalidConfigError", "RecordTooLargeError",
    "OffsetOutOfRangeError", "CorruptRecordError", "TopicExistsError",
    "UnknownTopicOrPartitionError", "CorruptSegmentError", "OffsetOverflowError",
    "StorageError", "DataDirectoryInUseError", "CorruptRingError", "RingFullError",
    "ClientClosedError", "BulkReaderUnavailableError",
]

# Where each lazily imported name lives.
_LAZY = {
    "Admin": "client.admin",
    "Broker": "server.broker",
    "TopicConfig": "storage.topic_config",
    "Consumer": "client.consumer",
    "ConsumerRebalanceListener": "client.consumer",
    "ConsumerRecord": "client.consumer",
    "GroupMetadata": "client.consumer",
    "OffsetAndMetadata": "common.structs",
    "OffsetAndTimestamp": "client.consumer",
    "TopicPartition": "common.structs",
    "DataDirectoryInUseError": "storage.log_manager",
    "LogManager": "storage.log_manager",
    "TopicMetadata": "storage.log_manager",
    "BatchMetadata": "client.producer_batch",
    "Producer": "client.producer",
    "LogHandler": "client.log_handler",
    "RecordMetadata": "client.producer_batch",
    "Record": "record.records",
    "RecordColumns": "record.records",
    "decode_columns": "record.records",
    "decode_records": "record.records",
    "encode_batch": "record.records",
    "AppendResult": "segments",
    "PartitionLog": "segments",
    "ReadResult": "segments",
    "RecoveryReport": "segments",
}


def __getattr__(name: str):
    """Import ``name`` from its module on first use (later uses find it in globals)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
