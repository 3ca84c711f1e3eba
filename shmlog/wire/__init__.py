"""Kafka's wire protocol: a listener in the broker that unmodified Kafka clients
(librdkafka, the Java client, kafka-python, kcat, ...) produce to and fetch from.

Kafka's own split: ``socket_server`` is its ``SocketServer`` (a thread owns the
sockets: framing, size limits, idle connections), ``apis`` its ``KafkaApis`` (each
request answered on the broker's loop, by API), and ``codec`` the one door to the
message classes, which are kafka-python's (built from Kafka's JSON schemas). Stored
batches are Kafka's record batch v2 byte for byte: Produce hands a client's batch to
the appender as it came, and Fetch sends stored batches as they lie in the segments.
Consumer groups (``group_apis``: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, DescribeGroups, ListGroups; ``offset_apis``: OffsetCommit, OffsetFetch)
are served over the broker's own group coordinator, so a group may hold shmlog
consumers and Kafka clients together.
"""
