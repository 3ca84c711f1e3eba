"""What a user's process runs: Producer, Consumer, the partition reader, Admin, the
partition assignors and Kafka's client options. Loads neither the broker, the cluster nor the
writer's kernels. Imports the layers below (common to protocol) and ``shmlog/groups.py``.
"""
