"""Replication message layout, version 1: the frames one broker sends another.

A message is one ZeroMQ multipart message of two or more frames::

    frame 0   envelope, 24 bytes, little-endian (below)
    frame 1   body: one UTF-8 JSON object, at most limits.REPLICATION_BODY_SIZE_MAX bytes
    frame 2…  records: one run of raw record batches (the log's format) per partition
              entry of the body that carries records, in the body's order

Envelope (frame 0)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-------------------------------+---------------+---------------+
  0 |          magic (u16)          |  version (u8) |   type (u8)   |
    +-------------------------------+---------------+---------------+
  4 |                    sender_broker_id (i32)                     |
    +---------------------------------------------------------------+
  8 |                  sender_broker_epoch (i64)                    |
    +                                                               +
    +---------------------------------------------------------------+
 16 |                     correlation_id (i64)                      |
    +                                                               +
    +---------------------------------------------------------------+
 24

* ``magic`` and ``version`` come first, so a receiver rejects a frame that is not
  ours before it trusts the rest. ``type`` is a :class:`MessageType`.
* ``sender_broker_epoch`` is the sender's broker epoch (the czxid of its
  ``/brokers/ids/<id>`` znode, KIP-380), so a leader can tell a restarted broker's
  requests from those of its previous incarnation.
* ``correlation_id`` (>= 0) is chosen by the requester and echoed by the reply; 0
  is never used by a request, and names "unknown" in an ERROR answering a message
  whose envelope could not be read.
* The body's fields, the number of record frames (one per partition entry whose
  ``records_bytes`` is positive) and each record frame's length (its
  ``records_bytes``) are checked by ``codec.decode``; anything else is a
  ``ReplicationProtocolError``. Record frames are not validated here: the log's
  append checks every batch (structure, CRC) as it does a producer's.
"""

from __future__ import annotations

import enum
import struct

__all__ = ["MAGIC", "VERSION", "MessageType", "ENVELOPE_FORMAT", "ENVELOPE_LENGTH",
           "REQUEST_TYPES", "RESPONSE_TYPE", "ENVELOPE_FRAME", "BODY_FRAME",
           "FIRST_RECORDS_FRAME"]

MAGIC = 0x5352                       # "RS" read as little-endian bytes
VERSION = 1


class MessageType(enum.IntEnum):
    """The envelope's ``type``."""
    FETCH = 1
    FETCH_RESPONSE = 2
    EPOCH_END = 3                    # Kafka's OffsetForLeaderEpoch
    EPOCH_END_RESPONSE = 4
    PRODUCE = 5                      # a batch forwarded to the leader
    PRODUCE_RESPONSE = 6
    ERROR = 7                        # the answer to a message that could not be read
    GROUP = 8                        # a consumer-group request forwarded to its coordinator
    GROUP_RESPONSE = 9
    DELETE_RECORDS = 10              # Kafka's DeleteRecords, forwarded to the leader
    DELETE_RECORDS_RESPONSE = 11
    TRANSACTION = 12                 # a transaction request for a coordinator or a leader
    TRANSACTION_RESPONSE = 13


# Which types are requests (sent by a DEALER, answered) and what answers each.
REQUEST_TYPES = frozenset({MessageType.FETCH, MessageType.EPOCH_END, MessageType.PRODUCE,
                           MessageType.GROUP, MessageType.DELETE_RECORDS,
                           MessageType.TRANSACTION})
RESPONSE_TYPE = {MessageType.FETCH: MessageType.FETCH_RESPONSE,
                 MessageType.EPOCH_END: MessageType.EPOCH_END_RESPONSE,
                 MessageType.PRODUCE: MessageType.PRODUCE_RESPONSE,
                 MessageType.GROUP: MessageType.GROUP_RESPONSE,
                 MessageType.DELETE_RECORDS: MessageType.DELETE_RECORDS_RESPONSE,
                 MessageType.TRANSACTION: MessageType.TRANSACTION_RESPONSE}

MAGIC_OFFSET = 0
MAGIC_SIZE = 2
VERSION_OFFSET = MAGIC_OFFSET + MAGIC_SIZE
VERSION_SIZE = 1
TYPE_OFFSET = VERSION_OFFSET + VERSION_SIZE
TYPE_SIZE = 1
SENDER_BROKER_ID_OFFSET = TYPE_OFFSET + TYPE_SIZE
SENDER_BROKER_ID_SIZE = 4
SENDER_BROKER_EPOCH_OFFSET = SENDER_BROKER_ID_OFFSET + SENDER_BROKER_ID_SIZE
SENDER_BROKER_EPOCH_SIZE = 8
CORRELATION_ID_OFFSET = SENDER_BROKER_EPOCH_OFFSET + SENDER_BROKER_EPOCH_SIZE
CORRELATION_ID_SIZE = 8
ENVELOPE_LENGTH = CORRELATION_ID_OFFSET + CORRELATION_ID_SIZE

# One struct, in the order above: magic, version, type, sender id, sender epoch,
# correlation id.
ENVELOPE_FORMAT = "<HBBiqq"

# Frame indexes of a message.
ENVELOPE_FRAME = 0
BODY_FRAME = 1
FIRST_RECORDS_FRAME = 2

assert ENVELOPE_LENGTH == 24
assert struct.calcsize(ENVELOPE_FORMAT) == ENVELOPE_LENGTH
assert SENDER_BROKER_EPOCH_OFFSET % SENDER_BROKER_EPOCH_SIZE == 0
assert CORRELATION_ID_OFFSET % CORRELATION_ID_SIZE == 0
assert set(RESPONSE_TYPE) == REQUEST_TYPES
