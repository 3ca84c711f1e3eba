"""The shmlog error tree: one root, split by who is at fault.

::

    ShmlogError
    ├── LocalProtocolError            our caller asked for something invalid
    │   ├── InvalidTopicError
    │   │   └── InternalTopicError    create, delete, grow or delete records of an internal topic
    │   ├── InvalidPartitionsError
    │   ├── InvalidConfigError
    │   │   ├── UnsupportedKafkaOptionError   a Kafka client option shmlog cannot honour
    │   │   ├── InternalTopicConfigError   a setting that could drop an internal topic's records
    │   │   └── InsecureListenerError   a listener other hosts reach, without TLS and SASL unwritten
    │   ├── OffsetMetadataTooLargeError   a commit's metadata is over the limit
    │   ├── RecordTooLargeError
    │   ├── ControlRequestTooLargeError   a control request is over the frame limit: not sent
    │   ├── OffsetOutOfRangeError
    │   ├── InvalidReplicationFactorError   below 1, or more than the live brokers
    │   ├── InvalidReplicaAssignmentError   some brokers have a rack and others not
    │   ├── InvalidReassignmentError   a reassignment names no such partition or broker
    │   ├── ReassignmentInProgressError   a reassignment already moves those partitions
    │   ├── UnsupportedRequestError   the broker has no such request type (older, or clustered)
    │   ├── AbortedTransactionOrderError   an aborted transaction indexed out of offset order
    │   └── IllegalStateError         the client's state does not allow the call (Kafka's)
    │       ├── ClientClosedError     a closed producer or consumer was used
    │       └── NotAssignedError      a consumer was asked about a partition not assigned to it
    ├── PeerProtocolError             bytes from another party are invalid
    │   ├── CorruptRecordError        a batch failed validation before append
    │   │   ├── UnexpectedAppendOffsetError   a leader's batch starts below the follower's log end
    │   │   └── OffsetsOutOfOrderError        a leader's batches' offsets do not increase
    │   ├── CorruptRingError          a ring holds bytes no producer could have written
    │   ├── StateTableInconsistentError   a state table row holds words no broker published
    │   ├── OutOfOrderSequenceError   an idempotent producer's sequence skipped or went back
    │   ├── InvalidProducerEpochError an idempotent producer's epoch is older than one appended
    │   ├── InvalidTxnStateError      a transactional batch from a producer with no transaction open
    │   ├── ZnodeFormatError          a znode's body is not what zk_paths lays out
    │   ├── KafkaRequestError         a Kafka client's request is malformed or unservable
    │   ├── UnsupportedCodecError     a Kafka batch uses a codec shmlog does not store
    │   └── ReplicationProtocolError  a peer broker's replication message is malformed
    ├── TopicExistsError
    ├── UnknownTopicOrPartitionError
    ├── CorruptSegmentError           data on disk failed its CRC or structure check
    ├── OffsetOverflowError
    ├── RingFullError                 a ring stayed full for the whole wait
    ├── TooManyProducersError         the broker drains producers_max rings already
    ├── ClientTimeoutError            a send's get() or a flush ran out of time
    ├── TooManyRequestsInFlightError  a client has too many control requests unanswered
    ├── BrokerNotAvailableError       no broker answered in time
    │   ├── BrokerNotRunningError     no broker runs (no control socket): nothing was sent
    │   ├── BrokerAccessDeniedError   this user may not connect to the broker
    │   └── ProducerIdsUnavailableError   the next block of producer ids is not drawn yet
    ├── NotOwnedError                 what shmlog must own is another user's (or a symlink)
    │   └── UnsafeDataDirectoryError  the path to the data directory is a symlink or another's
    ├── StorageError                  the log directory failed (disk full, I/O error)
    │   └── ResourceLimitError        a process or host limit was reached (files, mappings)
    ├── BulkReaderUnavailableError    Spark's bulk reader cannot be compiled here
    ├── ZooKeeperUnavailableError     a local ZooKeeper cannot run here (no pyspark jars, no java)
    │   └── ZooKeeperConnectionError  no session in time, or lost during a write (outcome unknown)
    ├── MetadataUnavailableError      no ZooKeeper: a metadata change was refused, nothing written
    ├── ZooKeeperStartError           a local ZooKeeper exited or did not serve while starting
    ├── NotEnoughReplicasError        acks=all: too few in-sync replicas, nothing appended
    ├── NotEnoughReplicasAfterAppendError   acks=all: appended, but too few replicas have it
    ├── NotLeaderOrFollowerError      the broker lost the partition's leadership
    ├── RequestTimedOutError          a forwarded batch was never answered: outcome unknown
    ├── InconsistentClusterIdError    the ZooKeeper chroot belongs to another cluster
    ├── BrokerIdInUseError            another live broker is registered under this id
    ├── ControllerMovedError          a newer controller was elected: this one resigns
    ├── ZooKeeperConflictError        a conditional ZooKeeper write found the znode changed
    │   ├── StaleStateVersionError    a partition state (or id block) was written meanwhile
    │   ├── ZnodeExistsError          a create found the znode there already
    │   └── ZnodeMissingError         a write found no znode (or no parent) to write
    ├── PreferredElectionInProgressError   an election asked for earlier is not done yet
    ├── LeaderElectionTimeoutError    the controller did not carry out an election in time
    ├── ReplicaNotCoveringError       a Spark task's broker holds no copy of the range
    ├── NetnsError                    an ip or nft command on network namespaces failed
    ├── SaslAuthenticationError       a Kafka client's SASL login failed (Kafka's code 58)
    │   ├── SaslMessageError          its SASL message is malformed or out of turn
    │   └── UnsupportedSaslMechanismError   it asked for a mechanism not enabled here
    ├── TransactionError              a transaction coordinator refused a request
    │   ├── ProducerFencedError       a newer producer took this transactional.id: close
    │   ├── InvalidProducerIdMappingError   the transactional.id has another producer id
    │   ├── ConcurrentTransactionsError   the previous transaction is still ending: retry
    │   ├── InvalidTransactionTimeoutError   over transaction.max.timeout.ms
    │   ├── TransactionAbortedError   the transaction was aborted (timeout, or a failed send)
    │   ├── OpenTransactionNotFoundError   no open transaction starts at that offset
    │   ├── TransactionStillOngoingError   an operator's abort of one its coordinator holds
    │   └── SinkTransactionLostError  a Spark sink's prepared transaction ended before its commit
    └── GroupError                    a consumer group refused a request
        ├── UnknownMemberIdError      the member was removed from its group: join again
        ├── IllegalGenerationError    the member's generation is over (fenced): join again
        ├── RebalanceInProgressError  the group is rebalancing: join again
        ├── FencedInstanceIdError     another member took this group.instance.id
        ├── CommitFailedError         a commit was fenced by a rebalance
        │   └── PartitionNotAssignedError   the partition is another member's now
        ├── JoinCancelledError        the consumer left during its join
        ├── CoordinatorError          the coordinator cannot serve now: ask again later
        │   ├── NotCoordinatorError   this broker does not coordinate the group
        │   ├── CoordinatorNotAvailableError   no coordinator can be reached now
        │   └── CoordinatorLoadInProgressError   it is reading the offsets back
        ├── GroupIdNotFoundError
        ├── NonEmptyGroupError        the group has active members
        └── InconsistentGroupProtocolError   the members share no assignor

Messages name the path, offset, and expected and actual values, and say what to do.
"""

from __future__ import annotations


class ShmlogError(Exception):
    """Root of every error shmlog raises on purpose."""


class LocalProtocolError(ShmlogError, ValueError):
    """The caller broke the API's contract (an invalid argument or request)."""


class PeerProtocolError(ShmlogError):
    """Another party (a producer, a peer broker) sent bytes that are invalid."""


class InvalidTopicError(LocalProtocolError):
    """A topic name breaks Kafka's naming rules, or names an internal topic where a
    producer may not write (Kafka's InvalidTopicException)."""


class InternalTopicError(InvalidTopicError):
    """A client asked to create, delete, grow or delete records of an internal topic
    (``internal_topics.INTERNAL_TOPICS``): the broker owns it, and each would lose
    consumer groups' committed offsets. Kafka refuses the same (its
    InvalidTopicException: INVALID_TOPIC_EXCEPTION, also DeleteRecords' per-partition
    answer for an internal topic)."""


class InvalidPartitionsError(LocalProtocolError):
    """A partition count or partition number is out of range."""


class InvalidConfigError(LocalProtocolError):
    """A configuration name is unknown or its value is out of range."""


class OffsetMetadataTooLargeError(LocalProtocolError):
    """A committed offset's metadata is longer than ``offset.metadata.max.bytes``
    (Kafka's OFFSET_METADATA_TOO_LARGE)."""


class RecordTooLargeError(LocalProtocolError):
    """A record batch exceeds ``max.message.bytes`` (or a fixed format limit)."""


class ControlRequestTooLargeError(LocalProtocolError):
    """A control request is longer than ``limits.CONTROL_FRAME_SIZE_MAX``: the client
    refuses to send it, and the broker refuses one sent anyway at once, unread;
    nothing was done. Ask for less per request."""


class OffsetOutOfRangeError(LocalProtocolError):
    """An offset lies outside ``[log_start_offset, log_end_offset]`` (fields -1 where
    unknown: an error that came from the broker carries only its message)."""

    def __init__(self, message: str, *, offset: int = -1, log_start_offset: int = -1,
                 log_end_offset: int = -1):
        super().__init__(message)
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class UnsupportedRequestError(LocalProtocolError):
    """The broker has no handler for the request type: an older broker, or a request
    only a single broker serves (a cluster's broker answers its own form). A client
    with another way to ask (``Admin.create_topics``: one topic per request) takes it."""


class AbortedTransactionOrderError(LocalProtocolError):
    """An aborted transaction given to a segment's transaction index out of order: its
    last offset (the abort marker's) not past the previous entry's, below the
    segment's base offset, or below its own first offset (Kafka's TransactionIndex
    refuses the same with an IllegalArgumentException). Nothing was written."""


class IllegalStateError(LocalProtocolError):
    """The client's state does not allow the call (Kafka's IllegalStateException):
    the subclasses say which state."""


class ClientClosedError(IllegalStateError):
    """A producer or consumer was used after ``close()`` (Kafka's IllegalStateError):
    create a new one."""


class NotAssignedError(IllegalStateError):
    """A consumer was asked for the position (or a seek, a pause) of a partition not
    assigned to it (Kafka's IllegalStateException "No current assignment"); the
    message says when it was dropped because its topic was deleted."""


class CorruptRecordError(PeerProtocolError):
    """A record batch offered for append is malformed; nothing of it was written."""

    def __init__(self, message: str, *, status: int = 0, position: int = 0):
        super().__init__(message)
        self.status = status
        self.position = position


class CorruptRingError(PeerProtocolError):
    """A shared-memory ring holds an entry no well-behaved producer writes; the
    entries before it stand, nothing after it is read."""

    def __init__(self, message: str, *, name: str = "", position: int = -1):
        super().__init__(message)
        self.name = name
        self.position = position


class StateTableInconsistentError(PeerProtocolError):
    """A row of the broker's partition state table holds a word no broker publishes
    (a negative size or generation, an offset past the log end): it was tampered
    with by a process that may write the table, the broker's user or root, since the
    data group may only read it. The segment files are not at fault; a broker
    restart makes a new table."""

    def __init__(self, message: str, *, table: str = "", row: int = -1):
        super().__init__(message)
        self.table = table
        self.row = row


class OutOfOrderSequenceError(PeerProtocolError):
    """An idempotent producer's batch did not carry the next sequence number."""


class InvalidProducerEpochError(PeerProtocolError):
    """An idempotent producer's batch carried an older epoch than one the broker has
    already appended from that producer id (Kafka's InvalidProducerEpochException):
    it is fenced."""


class InvalidTxnStateError(PeerProtocolError):
    """A batch marked transactional came from a producer that has no transaction
    open on its partition (Kafka's InvalidTxnStateException): nothing was appended."""


class RingFullError(ShmlogError):
    """The ring stayed full for the whole wait (Kafka's ``max.block.ms``): the
    consumer is not keeping up, or is gone."""


class TooManyProducersError(ShmlogError):
    """The broker drains its ``producers_max`` producers' rings already: a new producer
    is refused at registration (its ring removed), never left undrained. Close a
    producer, or start the broker with a larger ``producers_max``."""


class TooManyRequestsInFlightError(ShmlogError):
    """The broker holds as many of this client's control requests unanswered as it
    keeps for one client (``limits.CONTROL_PEER_REQUESTS_MAX`` requests,
    ``limits.CONTROL_PEER_BYTES_MAX`` bytes waiting): this one was refused at once,
    not queued, and nothing was done. Wait for replies before sending more."""


class BrokerNotAvailableError(ShmlogError):
    """No broker answered the request in time (none runs, or it is restarting)."""


class BrokerNotRunningError(BrokerNotAvailableError):
    """No broker runs on the data directory (it has no control socket): the request
    was not sent. Raised at once, where a broker that does not answer takes the
    request's whole timeout."""


class BrokerAccessDeniedError(BrokerNotAvailableError):
    """The broker's control socket exists, but this user may not connect to it (the
    broker keeps its data private, or shares it with a group this user is not in)."""


class NotOwnedError(ShmlogError):
    """Something shmlog must own belongs to another user (or is a symbolic link): a
    data directory, its lock, or a shared-memory object under the broker's name."""


class UnsafeDataDirectoryError(NotOwnedError):
    """The data directory, or a directory above it, is a symbolic link, belongs to
    another user than root or the broker's, or is writable by others without the
    sticky bit: someone else could point the broker's writes (and modes) elsewhere."""


class TopicExistsError(ShmlogError):
    """A topic with this name already exists."""


class UnknownTopicOrPartitionError(ShmlogError):
    """No such topic, or the topic has no such partition."""


class CorruptSegmentError(ShmlogError):
    """A segment or index on disk failed its CRC or structure check."""

    def __init__(self, message: str, *, path: str = "", position: int = -1):
        super().__init__(message)
        self.path = path
        self.position = position


class OffsetOverflowError(ShmlogError):
    """An offset would not fit the format (beyond 2**63 - 1, or a segment's u32 span)."""


class StorageError(ShmlogError):
    """The log directory failed: disk full, permission denied, I/O error."""


class ResourceLimitError(StorageError):
    """A limit of the process or the host was reached: open files (RLIMIT_NOFILE),
    memory mappings (vm.max_map_count), /dev/shm or memory. ``limit`` names it; the
    message gives the values and how to raise it. What was acknowledged is kept."""

    def __init__(self, message: str, *, limit: str = ""):
        super().__init__(message)
        self.limit = limit


class BulkReaderUnavailableError(ShmlogError):
    """The JVM bulk reader of ``shmlog.spark.bulk_read`` is not available (no JDK,
    or its sources did not compile): read with ``format("shmlog")`` instead."""


class ZooKeeperUnavailableError(ShmlogError):
    """A local ZooKeeper server cannot be run here: PySpark (whose jars hold
    ZooKeeper's) or a Java runtime is missing."""


class ZooKeeperStartError(ShmlogError):
    """A local ZooKeeper server exited, or did not serve in time, while starting
    (a port in use, a data directory it cannot write): its log names the cause."""


class TransactionError(ShmlogError):
    """A transaction coordinator refused a request (Kafka's transactional producer
    errors)."""


class ProducerFencedError(TransactionError):
    """Another producer initialised the same ``transactional_id`` since, with a newer
    epoch (or the coordinator fenced this one when its transaction timed out): this
    producer can do nothing more, close it (Kafka's PRODUCER_FENCED, fatal)."""


class InvalidProducerIdMappingError(TransactionError):
    """The ``transactional_id`` is not mapped to the producer id given (expired, or
    never initialised): call ``init_transactions`` (Kafka's
    INVALID_PRODUCER_ID_MAPPING)."""


class ConcurrentTransactionsError(TransactionError):
    """The ``transactional_id``'s previous transaction is still being completed (its
    markers are not all written): retry after a backoff (Kafka's
    CONCURRENT_TRANSACTIONS, retriable)."""


class InvalidTransactionTimeoutError(TransactionError):
    """The transaction timeout asked for is not positive or exceeds the broker's
    ``transaction_max_timeout_ms`` (Kafka's INVALID_TRANSACTION_TIMEOUT)."""


class TransactionAbortedError(TransactionError):
    """The transaction was aborted, by the coordinator (its timeout passed) or because
    one of its sends failed: its records are not committed (Kafka's
    TransactionAbortedException); abort it and begin another."""


class OpenTransactionNotFoundError(TransactionError):
    """No transaction open in the partition starts at the offset an operator named
    (``shmlog transactions abort``; Kafka's kafka-transactions abort finds none there
    either): nothing was written. ``shmlog transactions find-hanging`` lists the start
    offsets of the open ones."""


class TransactionStillOngoingError(TransactionError):
    """An operator asked to abort a transaction that its coordinator still holds
    (Ongoing with that partition, or being ended): nothing was written. It ends when
    its producer commits or aborts it, or at its timeout; to end it sooner, fence its
    producer (a new producer of its transactional id)."""


class SinkTransactionLostError(TransactionError):
    """The transactional Spark sink (``shmlog.spark.sink_transactions``) found a task's
    prepared transaction aborted or fenced before the driver committed it (its
    timeout passed): before the decision the write fails and a streaming query runs
    the micro-batch again; after it, the message says what is lost. Also a decision
    too large to store (too many writing tasks)."""


class GroupError(ShmlogError):
    """A consumer group's coordinator refused a request."""


class UnknownMemberIdError(GroupError):
    """The group has no such member (it left, or missed its session timeout): the
    member must join again with a new id; its partitions are gone."""


class IllegalGenerationError(GroupError):
    """The member speaks for a generation of its group that is over: it was fenced
    and must join again."""


class RebalanceInProgressError(GroupError):
    """The group is rebalancing: the member must join again to stay in it."""


class FencedInstanceIdError(GroupError):
    """A static member (``group.instance.id``) spoke with a member id that is no longer
    its instance's: a newer member with the same instance id joined and took its
    place (KIP-345). This one must stop; give each running consumer its own
    ``group.instance.id``."""


class CommitFailedError(GroupError):
    """An offset commit was refused because the group rebalanced and the partitions
    may belong to another member now (kafka-python's name)."""


class PartitionNotAssignedError(CommitFailedError):
    """A member committed an offset for a partition that its group's current
    generation assigns to another member: only the owner commits a partition."""


class JoinCancelledError(GroupError):
    """A join ended because the consumer left its group (unsubscribe, close) while
    the join waited for its rebalance."""


class GroupIdNotFoundError(GroupError):
    """No group by that id (nothing committed, no members)."""


class NonEmptyGroupError(GroupError):
    """The request needs a group without active members (delete, reset offsets)."""


class InconsistentGroupProtocolError(GroupError):
    """A member offers no assignor that every other member of the group supports."""


# --- cluster mode: ZooKeeper client and controller -----------------------------------------

class ZnodeFormatError(PeerProtocolError):
    """A znode's body (written by another broker, or by hand) is not what
    ``zk_paths`` lays out: malformed JSON, a missing field, a value out of range."""


class KafkaRequestError(PeerProtocolError):
    """A Kafka client's request cannot be served: its frame is malformed, over
    ``socket.request.max.bytes``, or of an API or version the broker does not
    advertise. Kafka closes such a connection; so does the listener, logging this."""


class UnsupportedCodecError(PeerProtocolError):
    """A Kafka client's record batch is compressed with a codec shmlog does not store
    (snappy, lz4: it stores none and zstd, and takes gzip); nothing of it was
    written. The client can set ``compression.type`` to zstd, gzip or none."""


class ZooKeeperConnectionError(ZooKeeperUnavailableError):
    """No ZooKeeper session could be had in time, or the connection was lost during
    a request: a write's outcome is unknown (read back before retrying)."""


class MetadataUnavailableError(ShmlogError):
    """A metadata change (create or delete a topic, alter a topic's config) was
    refused because the broker's ZooKeeper session is suspended: ZooKeeper is out of
    reach, so the change could not be made now. Nothing was written, and nothing of
    it appears later. Retriable: send it again once ZooKeeper answers (Kafka's
    brokers cannot change metadata without ZooKeeper either; produce and fetch go
    on meanwhile)."""


class InconsistentClusterIdError(ShmlogError):
    """The ZooKeeper chroot belongs to another cluster: its ``/cluster/id`` is not this
    broker's ``cluster.id`` (Kafka's InconsistentClusterIdException). The broker
    refuses to start rather than join someone else's cluster."""


class BrokerIdInUseError(ShmlogError):
    """Another live broker (another ZooKeeper session) is registered under this
    broker id, and its registration did not go away within the session timeout."""


class ControllerMovedError(ShmlogError):
    """A controller's write was refused because ``/controller_epoch`` moved on: a
    newer controller was elected, and this one must resign (Kafka's
    ControllerMovedException). Nothing of the write was applied."""


class ZooKeeperConflictError(ShmlogError):
    """A conditional ZooKeeper write was refused because a znode is not as the writer
    believed (it exists, it is missing, or it has another version). Nothing of the
    write was applied; re-read and decide again. ``path`` names the znode."""

    def __init__(self, message: str, *, path: str = ""):
        super().__init__(message)
        self.path = path


class StaleStateVersionError(ZooKeeperConflictError):
    """A versioned write (a partition state's ISR change, a producer-id block) found
    another zkVersion: someone wrote the znode since it was read. A leader re-reads
    its partition's state and follows it if the leader epoch moved."""


class ZnodeExistsError(ZooKeeperConflictError):
    """A create was refused: the znode exists already (ZooKeeper's NodeExists)."""


class ZnodeMissingError(ZooKeeperConflictError):
    """A write was refused: its znode (or, for a create, its parent) does not exist
    (ZooKeeper's NoNode)."""
# --- replication -----------------------------------------------------------------------


class ReplicationProtocolError(PeerProtocolError):
    """A peer broker sent a replication message that is not one: a wrong magic,
    version or type, a body that is not the JSON object its type needs, a field of
    the wrong type or out of range, record frames that do not match the body."""
# --- cluster configuration and replica assignment (cluster_config, cluster_metadata) -----
class InvalidReplicationFactorError(LocalProtocolError):
    """A topic's replication factor is below 1 or above the number of live brokers
    (Kafka's InvalidReplicationFactorException)."""


class InvalidReplicaAssignmentError(LocalProtocolError):
    """Replicas cannot be assigned as asked: some brokers have a rack and others do
    not (Kafka's AdminOperationException; assign without racks to go on)."""
# --- acks=all and min.insync.replicas --------------------------------------------------
# Kafka's producer retries all four (they are its RetriableExceptions): the condition
# may pass. shmlog's tree has no "retriable" notion of its own, so each says so in its
# docstring; a producer fails the batch's futures with them and sends nothing again.

class NotEnoughReplicasError(ShmlogError):
    """An acks=all batch was refused before it was appended: its partition has fewer
    in-sync replicas than ``min.insync.replicas`` (Kafka's NotEnoughReplicasException).
    Nothing was appended. Retriable: send it again once the replicas caught up."""


class NotEnoughReplicasAfterAppendError(ShmlogError):
    """An acks=all batch was appended, but when the high watermark covered it the
    partition had fewer in-sync replicas than ``min.insync.replicas`` (Kafka's
    NotEnoughReplicasAfterAppendException). The records are in the log, so they may
    be read. Retriable: an idempotent producer's re-send is deduplicated."""


class NotLeaderOrFollowerError(ShmlogError):
    """The broker is no longer the partition's leader (a newer leader epoch, lost
    contact with ZooKeeper), or the batch was truncated away when it became a
    follower (Kafka's NotLeaderOrFollowerException). The batch is not in the
    partition's log. Retriable: the next send goes to the new leader."""


class RequestTimedOutError(ShmlogError):
    """A batch the local broker forwarded to the partition's leader got no answer in
    time (Kafka's TimeoutException): it may or may not have been appended. Retriable;
    an idempotent producer's re-send is deduplicated if it was."""
# --- replication storage (the follower's append) ----------------------------------------

class UnexpectedAppendOffsetError(CorruptRecordError):
    """A follower's append began below the log end: the batches are not the ones
    that follow this log (Kafka's UnexpectedAppendOffsetException). Nothing was
    appended; the fetcher truncates again (KIP-279) before fetching on."""


class OffsetsOutOfOrderError(CorruptRecordError):
    """A follower's append holds a batch whose base offset is not above the last
    offset of the batch before it (Kafka's OffsetsOutOfOrderException). Nothing was
    appended."""
# --- cluster operations (producer ids) --------------------------------------------------

class ProducerIdsUnavailableError(BrokerNotAvailableError):
    """A cluster member has handed out every producer id of its block and has not
    drawn the next from ZooKeeper yet (it is unreachable, or the draw is under way):
    the producer cannot register now. Retriable."""
# --- partition reassignment (reassignment.py, controller, cli reassign) -----------------

class InvalidReassignmentError(LocalProtocolError):
    """A reassignment request names a partition that does not exist, an empty or
    repeating replica list, or a broker that is not registered (Kafka's
    InvalidReplicaAssignmentException); nothing of it is carried out."""


class ReassignmentInProgressError(LocalProtocolError):
    """A reassignment is already under way for partitions a new request names
    (Kafka's ``There is an existing assignment running``): verify it, or cancel it,
    first."""


# --- leader balance (controlled shutdown, preferred election) ---------------------------

class PreferredElectionInProgressError(ShmlogError):
    """``/admin/preferred_replica_election`` exists: the controller has not finished
    an election asked for earlier (Kafka's "Preferred replica leader election
    currently in progress"). Try again once it is gone."""


class LeaderElectionTimeoutError(ShmlogError):
    """The controller did not carry out a preferred replica election in time (no
    controller is elected, or it cannot reach ZooKeeper); the request is left in
    ``/admin/preferred_replica_election`` for the next controller."""
# --- consumer groups across hosts -------------------------------------------------------

class CoordinatorError(GroupError):
    """The group's coordinator cannot serve the request now: ask again after a
    backoff (Kafka's retriable coordinator errors; its client then looks the
    coordinator up again)."""


class NotCoordinatorError(CoordinatorError):
    """The broker asked does not coordinate the group (it does not lead the group's
    ``__consumer_offsets`` partition, or stopped leading it while the request
    waited): Kafka's NOT_COORDINATOR."""


class CoordinatorNotAvailableError(CoordinatorError):
    """No coordinator can be reached now: the offsets topic is being created, its
    partition has no leader, the forward got no answer, or the commit could not be
    replicated (NOT_ENOUGH_REPLICAS): Kafka's COORDINATOR_NOT_AVAILABLE."""


class CoordinatorLoadInProgressError(CoordinatorError):
    """The coordinator is reading its partition's committed offsets back after it
    became its leader: Kafka's COORDINATOR_LOAD_IN_PROGRESS."""
# --- Spark on a cluster (shmlog.spark) --------------------------------------------------

class ReplicaNotCoveringError(ShmlogError):
    """A Spark task's broker held no copy of a partition, or its copy did not reach
    the range's end (its high watermark stayed below it), within
    ``limits.SPARK_REPLICA_WAIT_MS``: the message names the host and the partition."""
# --- network namespaces (netns.py: partition tests, the three-host demo) ---------------

class NetnsError(ShmlogError):
    """An ``ip`` or ``nft`` command that makes, cuts or removes network namespaces
    failed (its command line and stderr say why)."""
# --- kafka-python API fit (client_options.py, shmlog.kafka) ----------------------------

class UnsupportedKafkaOptionError(InvalidConfigError):
    """A Kafka client option shmlog does not support (transactions, TLS or SASL, a
    custom partitioner, ...) was given: the message names the option and says why.
    Options shmlog does not know at all are :class:`InvalidConfigError`."""


class InternalTopicConfigError(InvalidConfigError):
    """A config change on an internal topic that could let retention delete records
    the broker still needs (``__consumer_offsets``' committed offsets): refused as
    Kafka refuses an invalid config (INVALID_CONFIG); the topic keeps its config."""


class ClientTimeoutError(ShmlogError):
    """A client's wait ran out: a send's acknowledgement (``get(timeout)``) or a
    ``flush(timeout)`` (Kafka's KafkaTimeoutError). What it waited for may still
    complete later."""


# --- Kafka's wire protocol: listeners and SASL (shmlog/wire) ------------------------------

class InsecureListenerError(InvalidConfigError):
    """A Kafka listener bound where other hosts reach it (not a loopback address) has a
    security protocol other than SASL_SSL that no setting the operator wrote names for
    it (it came from a default): shmlog serves other hosts without TLS and SASL only
    when told to in so many words (``wire.listeners``)."""


class SaslAuthenticationError(ShmlogError):
    """A Kafka client's SASL authentication failed (Kafka's SaslAuthenticationException,
    SASL_AUTHENTICATION_FAILED): a wrong password, an unknown user (the message does not
    say which), a proof that does not verify. The connection is closed after the
    answer; the client may log in again."""


class SaslMessageError(SaslAuthenticationError):
    """A client's SASL message breaks its mechanism's syntax (RFC 4616, RFC 5802) or
    came after the exchange ended: answered as a failed authentication, as Kafka does."""


class UnsupportedSaslMechanismError(SaslAuthenticationError):
    """A client asked for a SASL mechanism this listener does not enable
    (``sasl.enabled.mechanisms``; Kafka's UNSUPPORTED_SASL_MECHANISM)."""
