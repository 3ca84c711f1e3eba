"""The log on disk: topic configs, the index layouts, mapped files, each segment's
append state and the segment generation, leader epochs, producer-state snapshots, the log
manager, the cleaner (compaction), DeleteRecords' rules, durable file changes and segment
dumps. ``shmlog/segments.py``, the partition log, belongs to this layer. Imports common,
native, record and shm.
"""
