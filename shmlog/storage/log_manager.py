"""Topics on disk: the data directory, topic metadata, and the partition logs.

Layout::

    <data_dir>/
      broker.lock                  held (flock) by the one process writing here
      topics/
        <topic>/
          topic.json               name, id, partition count, config overrides
          0/  1/  ...              one PartitionLog directory per partition
        <topic>~<id>.deleted/      a deletion in progress (never a valid topic name)

Rules: one process owns a data directory at a time (the lock says who); the
directory belongs to that process's user, and what it makes there has the modes of
``access`` (0700/0600 unless shared with a group); topic names follow Kafka's
rules; metadata files are replaced atomically.

Closing closes the logs on ``limits.LOG_CLOSE_THREADS_MAX`` threads: each log's
close is its own files' fsyncs (a few each), which release the GIL, so a broker of
thousands of partitions leaves in the time of its disk's parallel fsyncs, not of
thousands of fsyncs one after another (a controlled shutdown of 1,000 partitions
spent 17 s there). Every log is still flushed and closed before ``close`` returns.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

from ..common import access, limits
from ..common.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    NotOwnedError,
    StorageError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from ..common.topic_names import validate_topic_name
from ..segments import PartitionLog
from .durable_files import write_atomically
from .topic_config import TopicConfig

log = logging.getLogger(__name__)

__all__ = ["LogManager", "TopicMetadata", "DataDirectoryInUseError"]

TOPICS_DIRECTORY = "topics"
LOCK_FILE = "broker.lock"
TOPIC_FILE = "topic.json"
TOPIC_FILE_VERSION = 1
DELETED_SUFFIX = ".deleted"
# A topic id: uuid4().hex, as this module makes them and a cluster's metadata carries them.
_TOPIC_ID = re.compile(r"[0-9a-f]{32}")


class DataDirectoryInUseError(StorageError):
    """Another process already owns this data directory."""


def _validate_partition_count(count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or \
            not 1 <= count <= limits.PARTITIONS_PER_TOPIC_MAX:
        raise InvalidPartitionsError(f"partition count must be an integer in "
                                     f"[1, {limits.PARTITIONS_PER_TOPIC_MAX}], got {count!r}")
    return count


@dataclasses.dataclass(frozen=True)
class TopicMetadata:
    name: str
    topic_id: str
    partitions: int
    config: TopicConfig

    def to_json(self) -> str:
        return json.dumps({"version": TOPIC_FILE_VERSION, "name": self.name,
                           "topic_id": self.topic_id, "partitions": self.partitions,
                           "config": self.config.overrides()}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, path: str) -> "TopicMetadata":
        try:
            body = json.loads(text)
            if body.get("version") != TOPIC_FILE_VERSION:
                raise ValueError(f"version {body.get('version')!r}, expected {TOPIC_FILE_VERSION}")
            return cls(validate_topic_name(body["name"]), str(body["topic_id"]),
                       _validate_partition_count(body["partitions"]),
                       TopicConfig.from_overrides(body.get("config", {})))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise StorageError(f"{path}: unreadable topic metadata ({error})") from error


class LogManager:
    """Owns a data directory: creates, alters and deletes topics, and opens the
    partition logs (each once, lazily).

    Parameters
    ----------
    data_dir : str
        Created when missing. Locked for this object's lifetime.

    Raises
    ------
    DataDirectoryInUseError
        Another process holds the directory.
    NotOwnedError
        Another user owns the directory or its lock, or the lock is a symbolic link.
    UnsafeDataDirectoryError
        The directory or one above it is a symbolic link, another (non-root) user's,
        or writable by others without the sticky bit (``access.prepare_data_dir``).
    """

    def __init__(self, data_dir: str):
        # Checked once, from / down; the path checked is the one used from now on.
        self.data_dir = access.prepare_data_dir(data_dir)
        self.topics_dir = os.path.join(self.data_dir, TOPICS_DIRECTORY)
        self._lock_fd = self._lock()
        access.protect_data_dir(self.data_dir)
        try:
            access.make_directories(self.topics_dir)
        except OSError as error:
            raise StorageError(f"cannot create {self.topics_dir}: {error}") from error
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._topics: dict[str, TopicMetadata] = {}
        # Partitions whose directory this object made, empty, and whose log is not
        # open yet: opening one has nothing to recover (PartitionLog's ``new``).
        self._new: set[tuple[str, int]] = set()
        self._finish_deletions()
        for name in os.listdir(self.topics_dir):
            path = os.path.join(self.topics_dir, name, TOPIC_FILE)
            if os.path.exists(path):
                with open(path) as source:
                    metadata = TopicMetadata.from_json(source.read(), path)
                self._topics[metadata.name] = metadata

    def _lock(self) -> int:
        """Lock the directory; a lock file that is a symbolic link or another user's
        is refused before anything is written to it (its target would be truncated)."""
        path = os.path.join(self.data_dir, LOCK_FILE)
        try:
            fd = access.open_file(path, os.O_RDWR | os.O_CREAT)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise NotOwnedError(f"{path} is a symbolic link; shmlog never writes through "
                                    f"one: remove it") from None
            raise StorageError(f"cannot open {path}: {error}") from error
        try:
            owner = os.fstat(fd).st_uid
            if owner != os.geteuid():
                raise NotOwnedError(f"{path} belongs to {access.owner_name(owner)}, not to "
                                    f"{access.owner_name(os.geteuid())}: remove it")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirectoryInUseError(
                f"{self.data_dir} is in use by another shmlog process (it holds {path}); "
                f"stop it first or choose another data directory") from None
        except NotOwnedError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return fd

    def _finish_deletions(self) -> None:
        for name in os.listdir(self.topics_dir):
            if name.endswith(DELETED_SUFFIX):
                shutil.rmtree(os.path.join(self.topics_dir, name), ignore_errors=True)

    # -- topics --------------------------------------------------------------------
    def _topic_dir(self, name: str) -> str:
        return os.path.join(self.topics_dir, name)

    def _save(self, metadata: TopicMetadata) -> None:
        write_atomically(os.path.join(self._topic_dir(metadata.name), TOPIC_FILE),
                         metadata.to_json())
        self._topics[metadata.name] = metadata

    def create_topic(self, name: str, partitions: int = 1,
                     config: Mapping[str, Any] | None = None, *,
                     topic_id: str | None = None) -> TopicMetadata:
        """Create a topic with ``partitions`` empty partitions.

        ``topic_id`` is the id a cluster's metadata gave the topic (32 lowercase hex
        digits), so every replica's partitions carry the same identity (ring
        entries' topic key derives from it); by default a new one is made.

        Raises
        ------
        InvalidTopicError, InvalidPartitionsError, InvalidConfigError, TopicExistsError
        """
        validate_topic_name(name)
        _validate_partition_count(partitions)
        well_formed = isinstance(topic_id, str) and _TOPIC_ID.fullmatch(topic_id)
        if topic_id is not None and not well_formed:
            raise InvalidTopicError(f"a topic id is 32 lowercase hex digits, got {topic_id!r}")
        topic_config = TopicConfig.from_overrides(config)
        if name in self._topics:
            raise TopicExistsError(f"topic {name!r} already exists")
        metadata = TopicMetadata(name, topic_id or uuid.uuid4().hex, partitions, topic_config)
        try:
            access.make_new_directory(self._topic_dir(name))    # or left by a crash: kept
        except OSError as error:
            raise StorageError(f"cannot create {self._topic_dir(name)}: {error}") from error
        self._make_partition_directories(name, 0, partitions)
        try:
            self._save(metadata)
        except StorageError:
            self._new.difference_update((name, partition) for partition in range(partitions))
            raise
        log.info("created topic %s with %d partitions", name, partitions)
        return metadata

    def _make_partition_directories(self, name: str, first: int, end: int) -> None:
        """Make the directories of partitions ``first`` to ``end - 1`` (before the
        topic's metadata names them, so a crash never leaves a partition without
        one); those made here, empty, open without a recovery. One already there
        (left by a crash before its topic's metadata was written) is opened as
        any other, through the loader."""
        directory = self._topic_dir(name)
        try:
            for partition in range(first, end):
                if access.make_new_directory(os.path.join(directory, str(partition))):
                    self._new.add((name, partition))
        except OSError as error:
            raise StorageError(f"cannot create the partition directories of {name!r} in "
                               f"{directory}: {error}") from error

    def describe_topic(self, name: str) -> TopicMetadata:
        try:
            return self._topics[name]
        except KeyError:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}") from None

    def has_topic(self, name: str) -> bool:
        """Is there a topic of that name?"""
        return name in self._topics

    def list_topics(self) -> list[str]:
        return sorted(self._topics)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its data (readers holding mappings keep them)."""
        metadata = self.describe_topic(name)
        for partition in range(metadata.partitions):
            self._new.discard((name, partition))
            partition_log = self._logs.pop((name, partition), None)
            if partition_log is not None:
                partition_log.close()
        doomed = os.path.join(self.topics_dir, f"{name}~{metadata.topic_id}{DELETED_SUFFIX}")
        os.rename(self._topic_dir(name), doomed)
        del self._topics[name]
        shutil.rmtree(doomed, ignore_errors=True)

    def add_partitions(self, name: str, total: int) -> TopicMetadata:
        """Grow a topic to ``total`` partitions (Kafka never shrinks one)."""
        metadata = self.describe_topic(name)
        _validate_partition_count(total)
        if total <= metadata.partitions:
            raise InvalidPartitionsError(
                f"topic {name!r} has {metadata.partitions} partitions; the new count must be "
                f"larger, got {total}")
        self._make_partition_directories(name, metadata.partitions, total)
        updated = dataclasses.replace(metadata, partitions=total)
        self._save(updated)
        return updated

    def alter_topic_config(self, name: str, set_overrides: Mapping[str, Any] | None = None,
                           delete: tuple[str, ...] = ()) -> TopicMetadata:
        """Set and remove config overrides; open partition logs take the new values
        (each tells its writer: ``segments.LogChange.CONFIG_CHANGED``)."""
        metadata = self.describe_topic(name)
        overrides = {**metadata.config.overrides(), **(set_overrides or {})}
        for key in delete:
            if key not in overrides and key not in TopicConfig().as_dict():
                raise InvalidConfigError(f"unknown topic config {key!r}")
            overrides.pop(key, None)
        updated = dataclasses.replace(metadata, config=TopicConfig.from_overrides(overrides))
        self._save(updated)
        for partition in range(updated.partitions):
            partition_log = self._logs.get((name, partition))
            if partition_log is not None:
                partition_log.config = updated.config
        return updated

    # -- partitions ----------------------------------------------------------------
    def partition_log(self, name: str, partition: int) -> PartitionLog:
        """The open log of one partition (opened, and recovered, on first use)."""
        metadata = self.describe_topic(name)
        if isinstance(partition, bool) or not isinstance(partition, int) or \
                not 0 <= partition < metadata.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {name!r} has partitions 0..{metadata.partitions - 1}; "
                f"there is no partition {partition!r}")
        key = (name, partition)
        if key not in self._logs:
            self._logs[key] = PartitionLog(
                os.path.join(self._topic_dir(name), str(partition)), metadata.config,
                topic_id=metadata.topic_id, new=key in self._new)
            self._new.discard(key)
        return self._logs[key]

    def flush(self) -> None:
        for partition_log in self._logs.values():
            partition_log.flush()

    def close(self) -> None:
        """Close every partition log cleanly (several at once, see the module's
        docstring) and release the directory."""
        logs = list(self._logs.values())
        if len(logs) > 1:
            workers = min(limits.LOG_CLOSE_THREADS_MAX, len(logs))
            with ThreadPoolExecutor(workers, thread_name_prefix="close-log") as pool:
                for closed in [pool.submit(partition_log.close) for partition_log in logs]:
                    closed.result()             # a log's own error, once all were tried
        else:
            for partition_log in logs:
                partition_log.close()
        self._logs.clear()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
