"""The log on disk: topic configs, the index layouts, mapped files, each segment's
append state and the segment generation, leader epochs, producer-state snapshots, the log
manager, the cleaner (compaction), DeleteRecords' rules, durable file changes and segment
dumps; and the partition log's parts, cut as Kafka cuts its log: a segment
(``log_segment``), the segment list (``local_log``), opening and recovery
(``log_loader``), validation of appends (``log_validator``), retention and the log start
(``log_retention``), the writer's kernels (``segment_append``) and the read path
(``segment_read``: of the log, all a reader in another process loads). ``shmlog/segments.py``, the
partition log that composes them and the face of this layer, belongs to this layer.
May import common, native, record and shm (it needs no shared memory of its own).
"""
