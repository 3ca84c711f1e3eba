"""What a user's process runs: Producer, Consumer (with its parts: metadata, subscription
state, fetcher, and the group work over its group member), the partition reader, Admin
(and its offset-reset planning), the logging handler (``LogHandler``, over a Producer),
the partition assignors and Kafka's client options. Loads neither the broker (nor its
group coordinator), the cluster nor the writer's kernels. Imports the layers below
(common to protocol) and ``shmlog/groups.py``.
"""
