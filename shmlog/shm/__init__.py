"""Memory shared between processes: named POSIX shared-memory objects, the layouts of
the producer rings and of the partition state table, the state table itself, doorbells, and
the completion codes a producer reads back. ``shmlog/ring.py``, the ring, belongs to this
layer. Imports common and native.
"""
