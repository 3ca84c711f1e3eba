"""Append and read throughput of the log on disk, next to the same run's memcpy.

Goal
----
Say how close the storage layer (``PartitionLog.append`` / ``read`` and
``decode_columns``) comes to the machine's memory bandwidth, the bound for a log
whose appends are one copy into a mapped file and whose reads are zero-copy views.
The goals for this layer: append >= 30 % and read >= 50 % of the same run's
``np.copyto`` bandwidth, because an append is one copy into a mapped file and a
read is a zero-copy view, so anything much slower is overhead of our own, not of
the machine. Each figure with a goal is marked "met" or "below"; a benchmark never
asserts.

Method
------
1. memcpy: ``np.copyto`` between two pre-touched 256 MiB arrays, best of 7. A log
   append is exactly one such copy per byte, so this is the ceiling.
2. encode: ``encode_batch`` of ``--batch-records`` rows of ``--record-size`` random
   bytes (a 2-D uint8 array, the fixed-width path); reported, not part of append.
3. new file pages: a file the size of one append run is reserved and populated
   (fallocate + MADV_POPULATE_WRITE) as the appender prepares its segments; it is
   the kernel's (and a hypervisor's) share of every append, kept until the appends
   are done so they draw fresh pages from the same pool.
4. append: a few pre-encoded batches are appended round-robin to a fresh
   ``PartitionLog`` until ``--records`` records are in, once with one batch per call,
   once with 16 batches concatenated per call (the API takes several), and once more
   with 16 per call into one segment whose pages were reserved and populated before
   the clock started ("pages ready": the append path's own rate). Only the append
   calls are timed; ``close()`` (msync to disk) is reported on its own line. The log
   is rolled before closing so every segment with data is sealed.
5. read: in a spawned child process (new mappings, nothing verified yet), the log
   written by the one-batch append is opened and read from offset 0 to the end
   following ``next_offset``, with ``max_bytes`` 1 MiB and 4 MiB, (a) read only:
   each batch's CRC32C checked once and the batches returned as views, and (b) read +
   ``decode_columns(verified=True)`` over each read, the columnar consumer path that
   checks and indexes every record. A second pass in the same process reads the
   now-verified, mapped data again. Page-cache state: the data was just written, so
   it is in the page cache; "first pass" means cold mappings and unverified batches,
   not a cold disk.
6. A warm-up (small append and read in a throwaway directory, in the parent and in
   every child) pays numba's compile or cache-load before anything is timed.

Rates are records/s and GB/s (10^9 bytes/s) of batch bytes (headers included: each
record of 100 value bytes is 128 bytes on disk, plus 64 bytes per batch). Each row
also shows this process's CPU time over wall time and how many cores everything
else kept busy meanwhile; a warning is printed when the machine was not quiet.

Expected figures
----------------
A quiet run of the defaults (10 M records of 100 B, 1000 per batch: 1.28 GB of
batches) on a 2-vCPU Firecracker VM (AMD EPYC family 26, Linux 6.18, ext4 on virtio),
November 2026:

==========================================  =========  =========  =========  ======
figure                                      records/s  GB/s       of memcpy  goal
==========================================  =========  =========  =========  ======
memcpy (np.copyto, 256 MiB, best of 7)      -          15-17      100 %
new file pages (fallocate + POPULATE_WRITE) -          0.45-0.65  3-4 %
encode_batch                                13.5 M     1.7        10 %
append, 1 batch per call                    2.8 M      0.36       2 %        below
append, 16 batches per call                 3.0 M      0.39       2 %        below
append, 16 per call, pages ready            73 M       9.3        55 %       met
read 1 MiB, first pass (CRC)                67 M       8.5        50 %       met
read 4 MiB, first pass                      70 M       8.9        52 %       met
read, second pass (header walk only)        0.9-3 G    120-440    >> 100 %   met
read + decode_columns 1 MiB, first pass     35-40 M    4.4-5.1    26-30 %    below
read + decode_columns 1 MiB, second pass    52 M       6.7        40 %       below
read + decode_columns 4 MiB, either pass    23-29 M    3.0-3.7    18-22 %    below
==========================================  =========  =========  =========  ======

What bounds them (the notes under the table give the per-call medians):

* append: fresh page-cache pages. On this VM most guest memory is not backed by the
  host until first touched (and freed memory is handed back), so populating new
  file pages runs at ~0.45-0.65 GB/s, and no append into new pages can go faster;
  nearly all of its time is kernel time. With the pages ready, the append path
  itself (CRC and record check of the input, one memcpy, index entries) runs at
  ~9 GB/s, 55 % of memcpy.
* first read: CRC32C from memory (~10-11 GB/s on 128 KB batches).
* decode: one walk that checks the record structure and writes the columns (~8 ns
  per record from the core's cache, ~10 ns right after the read's CRC, which
  leaves the bytes in the last-level cache) plus allocating the columns: with 4 MiB reads the fresh
  column arrays (~1.7 MB) are page-faulted in again on every call. Reusing output
  arrays (the consumer's ``poll_batch``) removes that.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import mmap
import multiprocessing
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# As the Makefile does: compiled kernels are cached beside the repository, so only the
# first run anywhere pays numba's compile time. Set before shmlog is imported (and
# inherited by the spawned readers).
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))

import numba  # noqa: E402

import shmlog  # noqa: E402
import shmlog.common.limits  # noqa: E402
from shmlog.record.records import decode_columns, encode_batch, validate_batches  # noqa: E402
from shmlog.segments import PartitionLog  # noqa: E402
from shmlog.storage.topic_config import TopicConfig  # noqa: E402

MIB = 1 << 20
GB = 1e9
MEMCPY_SIZE = 256 * MIB
MEMCPY_RUNS = 7
ENCODE_SECONDS_MIN = 0.5            # encode loop: repeat until this much time has passed
DISTINCT_BATCHES = 4                # pre-encoded batches appended round-robin
MULTI_BATCH_COUNT = 16              # batches per append call in the multi-batch variant
READ_SIZES = (1 * MIB, 4 * MIB)
# The most a partition reserves ahead of its appends (storage/reservation.py).
POPULATE_STEP_SIZE = shmlog.common.limits.SEGMENT_RESERVE_AHEAD_MAX
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)     # Linux >= 5.14
# Goals, as shares of memcpy bandwidth: an append is one copy, a read a zero-copy view.
APPEND_GOAL = 0.30
READ_GOAL = 0.50
SEED = 20260521
OTHER_CORES_WARNING = 0.2           # report measurements taken while others ran
SLOW_CALL_FACTOR = 4                # calls this many times the median count as stalls
METER_SECONDS_MIN = 0.25            # shorter phases get no "others" figure (25 ticks)


# --- environment --------------------------------------------------------------------

_CPU_FLAGS_OF_INTEREST = ("sse4_2", "avx2", "avx512f", "erms", "fsrm", "hypervisor")


def _cpu_info() -> dict:
    """Model name, family/model/stepping (a VM may show only a vague name) and the
    flags that matter here (SSE4.2 for CRC32C, the copy instructions)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break                   # the first processor is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    flags = fields.get("flags", "").split()
    return {"cpu_model": fields.get("model name") or platform.processor() or "unknown",
            "cpu_family_model_stepping": "/".join(fields.get(key, "?") for key in
                                                  ("cpu family", "model", "stepping")),
            "cpu_mhz": fields.get("cpu MHz", "?"),
            "cpu_flags": [flag for flag in _CPU_FLAGS_OF_INTEREST if flag in flags]}


def _memory_total_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return -1


def _filesystem_of(path: str) -> str:
    """Type and device of the mount holding ``path`` (longest matching mount point)."""
    path = os.path.realpath(path)
    best, found = "", "unknown"
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                device, mount_point, kind = line.split()[:3]
                inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, found = mount_point, f"{kind} on {device} ({mount_point})"
    except OSError:
        pass
    return found


def _git_revision(package_directory: str) -> str:
    """Commit of the shmlog being measured, "+dirty" when its files differ from it."""
    try:
        revision = subprocess.run(["git", "-C", package_directory, "rev-parse", "--short",
                                   "HEAD"], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", package_directory, "status", "--porcelain", "."],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return revision + ("+dirty" if dirty else "") if revision else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _virtualized() -> bool:
    """The CPU reports a hypervisor: page-allocation costs may include the host's."""
    return "hypervisor" in _cpu_info()["cpu_flags"]


def environment(directory: str) -> dict:
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        **_cpu_info(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": len(os.sched_getaffinity(0)),
        "virtualized": _virtualized(),
        "memory_total_bytes": _memory_total_bytes(),
        "filesystem": _filesystem_of(directory),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "shmlog": shmlog.__version__,
        "shmlog_path": os.path.dirname(shmlog.__file__),
        "shmlog_revision": _git_revision(os.path.dirname(shmlog.__file__)),
        "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR", ""),
        "load_average_at_start": list(os.getloadavg()),
    }


# --- helpers ----------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def system_busy_seconds() -> float:
    """CPU time all processes have used (every non-idle field of /proc/stat's cpu line,
    steal included: time the host gave our vCPUs to someone else)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / _CLOCK_TICKS


class _Meter:
    """Wall time, this process's CPU time and page faults of a timed phase, and how
    many cores everything else kept busy meanwhile (a shared machine skews figures;
    the report says so rather than hiding it)."""

    def __init__(self):
        self._usage = resource.getrusage(resource.RUSAGE_SELF)
        self._busy = system_busy_seconds()
        self._start = time.perf_counter()

    def stop(self) -> dict:
        wall = time.perf_counter() - self._start
        usage = resource.getrusage(resource.RUSAGE_SELF)
        busy = system_busy_seconds() - self._busy
        own = (usage.ru_utime - self._usage.ru_utime) + (usage.ru_stime - self._usage.ru_stime)
        return {"seconds": wall, "cpu_seconds": own,
                "system_seconds": usage.ru_stime - self._usage.ru_stime,
                # /proc/stat counts in clock ticks (10 ms): too coarse for short phases.
                "other_cores": (max(0.0, busy - own) / wall
                                if wall >= METER_SECONDS_MIN else None),
                "minor_page_faults": usage.ru_minflt - self._usage.ru_minflt,
                "major_page_faults": usage.ru_majflt - self._usage.ru_majflt}


def _latency_summary(durations_ns: np.ndarray) -> dict:
    if not durations_ns.size:
        return {}
    microseconds = durations_ns / 1e3
    return {"calls": int(durations_ns.size),
            "p50_us": float(np.percentile(microseconds, 50)),
            "p99_us": float(np.percentile(microseconds, 99)),
            "max_us": float(microseconds.max()),
            "mean_us": float(microseconds.mean())}


def _config(segment_bytes: int) -> TopicConfig:
    # max.message.bytes must admit one batch; Kafka's 1 MiB default is too small for
    # 1000 records of 1 KiB, so it follows the segment size.
    return TopicConfig.from_overrides({"segment.bytes": segment_bytes,
                                       "max.message.bytes": segment_bytes})


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def make_values(count: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (count, width), dtype=np.uint8)


def warm_up(record_size: int, segment_bytes: int) -> None:
    """Call every kernel the timed phases call (numba compiles or loads its cache on
    the first call), with the same argument types, in a throwaway directory."""
    directory = tempfile.mkdtemp(prefix="shmlog-bench-warmup-")
    try:
        batch = encode_batch(make_values(10, record_size, 0))
        multi = np.concatenate([batch] * 3)
        log = PartitionLog(directory, _config(segment_bytes))
        log.append(batch)
        log.append(multi[:2 * batch.size])
        log.roll()
        log.close()
        log = PartitionLog(directory, _config(segment_bytes))
        offset = 0
        while offset < log.log_end_offset:
            result = log.read(offset, MIB)
            decode_columns(result.data, start_offset=offset, verified=True)
            decode_columns(result.data, start_offset=offset, verified=False)
            offset = result.next_offset
        validate_batches(multi)
        log.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def measure_memcpy() -> dict:
    source = np.full(MEMCPY_SIZE, 7, np.uint8)
    target = np.zeros(MEMCPY_SIZE, np.uint8)       # zeros() is lazy: touch it first
    target[::4096] = 1
    seconds = []
    meter = _Meter()
    for _ in range(MEMCPY_RUNS):
        start = time.perf_counter()
        np.copyto(target, source)
        seconds.append(time.perf_counter() - start)
    measured = meter.stop()
    best = min(seconds)
    # cpu_seconds is scaled to the best run, so cpu/wall is that of all the runs.
    return {"bytes": MEMCPY_SIZE, "runs": MEMCPY_RUNS, "best_s": best,
            "median_s": float(np.median(seconds)), "bytes_per_s": MEMCPY_SIZE / best,
            "cpu_seconds": measured["cpu_seconds"] * best / measured["seconds"],
            "other_cores": measured["other_cores"]}


def populate_new_file(path: str, size: int) -> dict:
    """What fresh page-cache pages cost: a new file of ``size`` bytes in the log's
    file system, reserved and populated in POPULATE_STEP_SIZE steps exactly as the
    appender prepares its segments (fallocate, then MADV_POPULATE_WRITE). Every
    appended byte needs such a page, so this bounds append from the kernel's side and,
    in a VM, the host's: a guest page the host has not backed (or has taken back,
    e.g. through free page reporting) costs a host fault, often 10-20x a native one.

    The file is left in place (the caller deletes it after the appends), so its pages
    are not handed straight back to the appender: both draw from the same pool.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    steps = []
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
        meter = _Meter()
        for position in range(0, size, POPULATE_STEP_SIZE):
            length = min(POPULATE_STEP_SIZE, size - position)
            began = time.perf_counter_ns()
            os.posix_fallocate(fd, position, length)
            mapping.madvise(MADV_POPULATE_WRITE, position, length)
            steps.append(time.perf_counter_ns() - began)
        measured = meter.stop()
        mapping.close()
    except (OSError, ValueError) as error:      # kernel < 5.14: no MADV_POPULATE_WRITE
        return {"bytes": 0, "seconds": 0.0, "error": str(error)}
    finally:
        os.close(fd)
    return {"records": 0, "bytes": size, **measured, "step_bytes": POPULATE_STEP_SIZE,
            "step_latency": _latency_summary(np.asarray(steps, np.int64))}


def measure_encode(values: list[np.ndarray]) -> tuple[list[np.ndarray], dict]:
    batches = [encode_batch(rows) for rows in values]
    calls = records = size = 0
    start = time.perf_counter()
    meter = _Meter()
    while True:
        for rows in values:
            batch = encode_batch(rows)
            calls += 1
            records += rows.shape[0]
            size += batch.size
        elapsed = time.perf_counter() - start
        if elapsed >= ENCODE_SECONDS_MIN:
            break
    return batches, {"calls": calls, "records": records, "bytes": size, **meter.stop()}


def measure_append(directory: str, batches: list[np.ndarray], records_total: int,
                   per_call: int, segment_bytes: int, prepopulate: bool = False) -> dict:
    """Append ``per_call`` batches per call, round-robin over ``batches``, until
    ``records_total`` records are in. Times the append calls only.

    With ``prepopulate`` the whole log fits one segment whose pages are reserved and
    populated before the clock starts: the append path's own rate, without the cost
    of fresh page-cache pages (the "new file pages" row measures that cost)."""
    records_per_batch = int(validate_batches(batches[0])[0].record_count)
    batch_size = batches[0].size
    assert all(batch.size == batch_size for batch in batches), "fixed-width batches"
    # The multi-batch buffer repeats the distinct batches; a prefix of it is whole
    # batches, which the last (short) call uses.
    unit = np.concatenate([batches[i % len(batches)] for i in range(per_call)])
    shutil.rmtree(directory, ignore_errors=True)
    batches_total = -(-records_total // records_per_batch)
    if prepopulate:
        segment_bytes = min(shmlog.common.limits.SEGMENT_SIZE_MAX, batches_total * batch_size + MIB)
    log = PartitionLog(directory, _config(segment_bytes))
    if prepopulate:
        log.active.reserve(batches_total * batch_size)
    calls = -(-batches_total // per_call)
    durations = np.empty(calls, np.int64)
    written_batches = 0
    meter = _Meter()
    for call in range(calls):
        count = min(per_call, batches_total - written_batches)
        if per_call == 1:
            source = batches[call % len(batches)]
        else:
            source = unit if count == per_call else unit[:count * batch_size]
        began = time.perf_counter_ns()
        log.append(source)
        durations[call] = time.perf_counter_ns() - began
        written_batches += count
    measured = meter.stop()
    records = log.log_end_offset
    size = log.size
    segments = len(log.segments)
    # Seal every segment with data (see the module docstring), then flush and unmap.
    log.roll()
    start_close = time.perf_counter()
    log.close()
    close_seconds = time.perf_counter() - start_close
    assert records == written_batches * records_per_batch
    # The median call finds its pages ready: its rate is the software's own. Calls far
    # slower than it waited for pages (or lost the CPU); their share of the time says
    # how much of the gap to the steady rate that explains.
    median = float(np.median(durations))
    full_calls = durations[:calls - 1] if calls > 1 else durations
    steady = per_call * batch_size / (float(np.median(full_calls)) / 1e9)
    return {"records": int(records), "bytes": int(size), **measured, "calls": calls,
            "batches_per_call": per_call, "segments": segments, "prepopulated": prepopulate,
            "close_seconds": close_seconds, "latency": _latency_summary(durations),
            "steady_bytes_per_s": steady,
            "slow_call_factor": SLOW_CALL_FACTOR,
            "slow_call_seconds": float(durations[durations > SLOW_CALL_FACTOR * median].sum()
                                       / 1e9)}


# --- the reading child ------------------------------------------------------------

def read_worker(directory: str, segment_bytes: int, max_bytes: int, decode: bool,
                record_size: int) -> dict:
    """Runs in a spawned process: open the log afresh and read it twice."""
    warm_up(record_size, segment_bytes)
    start = time.perf_counter()
    log = PartitionLog(directory, _config(segment_bytes))
    open_seconds = time.perf_counter() - start
    # Diagnostic only (a private attribute): how much the first pass must CRC-check.
    unverified = sum(segment.size - getattr(segment, "verified_end", 0)
                     for segment in log.segments)
    passes = []
    for _ in range(2):
        passes.append(_read_pass(log, max_bytes, decode))
    log.close()
    return {"open_seconds": open_seconds, "unverified_bytes_at_open": int(unverified),
            "log_bytes": passes[0]["bytes"], "passes": passes}


def _read_pass(log: PartitionLog, max_bytes: int, decode: bool) -> dict:
    offset = log.log_start_offset
    end = log.log_end_offset
    first = offset
    size = calls = decoded = 0
    durations = []
    meter = _Meter()
    while offset < end:
        began = time.perf_counter_ns()
        result = log.read(offset, max_bytes)
        if decode:
            columns = decode_columns(result.data, start_offset=offset, verified=True)
            decoded += len(columns)
        durations.append(time.perf_counter_ns() - began)
        size += result.data.size
        calls += 1
        offset = result.next_offset
    measured = meter.stop()
    records = offset - first
    if decode:
        assert decoded == records, (decoded, records)
    return {"records": int(records), "bytes": int(size), **measured, "calls": calls,
            "latency": _latency_summary(np.asarray(durations, np.int64))}


def measure_reads(directory: str, segment_bytes: int, record_size: int) -> list[dict]:
    context = multiprocessing.get_context("spawn")
    results = []
    for max_bytes in READ_SIZES:
        for decode in (False, True):
            # One fresh process per variant: each first pass starts unverified.
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
                result = pool.submit(read_worker, directory, segment_bytes, max_bytes, decode,
                                     record_size).result()
            result.update(max_bytes=max_bytes, decode=decode)
            results.append(result)
    return results


# --- report -------------------------------------------------------------------------

def _figure(name: str, measured: dict, memcpy_rate: float, goal: float | None) -> dict:
    seconds = measured["seconds"]
    rate = measured["bytes"] / seconds
    figure = {"name": name, "records": measured["records"], "bytes": measured["bytes"],
              "seconds": seconds, "records_per_s": measured["records"] / seconds,
              "bytes_per_s": rate, "ratio_to_memcpy": rate / memcpy_rate,
              "goal_ratio": goal,
              "cpu_per_wall": measured.get("cpu_seconds", float("nan")) / seconds,
              "other_cores": measured.get("other_cores")}
    if goal is not None:
        figure["verdict"] = "met" if rate / memcpy_rate >= goal else "below"
    return figure


def _cores(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _si(value: float) -> str:
    for scale, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if value >= scale:
            return f"{value / scale:.2f}{suffix}"
    return f"{value:.0f}  "


def print_table(report: dict) -> None:
    env, args = report["environment"], report["arguments"]
    print(f"shmlog log benchmark  {env['date']}  shmlog {env['shmlog']} "
          f"({env['shmlog_revision']})")
    print(f"host {env['host']}: {env['cpu_model']} (family/model/stepping "
          f"{env['cpu_family_model_stepping']}, {' '.join(env['cpu_flags'])}), "
          f"{env['cpu_count']} cores "
          f"({env['cpu_affinity_count']} usable), "
          f"{env['memory_total_bytes'] / 2**30:.0f} GiB; {env['platform']}; load average "
          f"{env['load_average_at_start'][0]:.2f} at the start")
    print(f"python {env['python']}, numpy {env['numpy']}, numba {env['numba']}; "
          f"data on {env['filesystem']}")
    print(f"{args['records']:,} records x {args['record_size']} B values in batches of "
          f"{args['batch_records']} ({report['batch_bytes']:,} B per batch, "
          f"{report['batch_bytes'] / args['batch_records']:.1f} B per record on disk); "
          f"segment.bytes {args['segment_bytes']:,}")
    print()
    header = (f"{'figure':<44} {'records/s':>10} {'GB/s':>7} {'of memcpy':>9} "
              f"{'goal':>6} {'verdict':>7}  {'cpu/wall':>8} {'others':>6}")
    print(header)
    print("-" * len(header))
    for figure in report["figures"]:
        records = _si(figure["records_per_s"]) if figure["records"] else "-"
        goal = f">={figure['goal_ratio']:.0%}" if figure["goal_ratio"] is not None else ""
        print(f"{figure['name']:<44} {records:>10} {figure['bytes_per_s'] / GB:>7.2f} "
              f"{figure['ratio_to_memcpy']:>9.1%} {goal:>6} {figure.get('verdict', ''):>7}  "
              f"{figure['cpu_per_wall']:>8.2f} {_cores(figure['other_cores']):>6}")
    print()
    for line in report["notes"]:
        print(line)


def build_report(args, env, memcpy, populate, encode, appends, reads, batch_bytes) -> dict:
    memcpy_rate = memcpy["bytes_per_s"]
    figures = [_figure(f"memcpy (np.copyto {MEMCPY_SIZE // MIB} MiB, best of {MEMCPY_RUNS})",
                       {"records": 0, "bytes": memcpy["bytes"], "seconds": memcpy["best_s"],
                        "cpu_seconds": memcpy["cpu_seconds"],
                        "other_cores": memcpy["other_cores"]}, memcpy_rate, None),
               _figure(f"encode_batch ({args.batch_records} x {args.record_size} B)", encode,
                       memcpy_rate, None)]
    notes = []
    if populate["bytes"]:
        figures.insert(1, _figure("new file pages (fallocate+POPULATE_WRITE)", populate,
                                  memcpy_rate, None))
        step = populate["step_latency"]
        notes.append(f"new file pages: {populate['bytes'] / 2**20:,.0f} MiB in "
                     f"{populate['step_bytes'] / 2**20:.0f} MiB steps, p50 "
                     f"{step['p50_us'] / 1e3:.1f} ms per step, max {step['max_us'] / 1e3:.1f} "
                     f"ms; the cost of the fresh pages every append needs"
                     + ("; in a VM it includes the host backing guest memory"
                        if env["virtualized"] else ""))
    else:
        notes.append(f"new file pages: not measured ({populate['error']})")
    for append in appends:
        per_call = append["batches_per_call"]
        name = f"append, {per_call} batch{'es' if per_call > 1 else ''} per call"
        if append["prepopulated"]:
            name += ", pages ready"
        figures.append(_figure(name, append, memcpy_rate, APPEND_GOAL))
        latency = append["latency"]
        notes.append(f"{name}: {append['calls']:,} calls, p50 {latency['p50_us']:.0f} us "
                     f"(the median call: {append['steady_bytes_per_s'] / GB:.2f} GB/s, "
                     f"{append['steady_bytes_per_s'] / memcpy_rate:.0%} of memcpy), "
                     f"p99 {latency['p99_us']:.0f} us, max {latency['max_us'] / 1e3:.0f} ms; "
                     f"calls over {append['slow_call_factor']}x the median took "
                     f"{append['slow_call_seconds'] / append['seconds']:.0%} of the time; "
                     f"{append['minor_page_faults']:,} minor faults, "
                     f"{append['system_seconds']:.2f} s in the kernel; "
                     f"{append['segments']} segment(s); "
                     f"close (msync to disk) {append['close_seconds']:.2f} s, not counted")
    for read in reads:
        kind = "read + decode_columns" if read["decode"] else "read"
        for number, (label, measured) in enumerate(zip(("first pass", "second pass"),
                                                       read["passes"])):
            name = f"{kind}, {read['max_bytes'] // MIB} MiB, {label}"
            figures.append(_figure(name, measured, memcpy_rate, READ_GOAL))
            latency = measured["latency"]
            extra = (f"; {read['unverified_bytes_at_open'] / measured['bytes']:.0%} of the "
                     f"bytes unverified at open; open {read['open_seconds'] * 1e3:.0f} ms"
                     if number == 0 else "")
            median_rate = measured["bytes"] / measured["calls"] / (latency["p50_us"] / 1e6)
            notes.append(f"{name}: {measured['calls']:,} calls, p50 {latency['p50_us']:.0f} "
                         f"us (the median call: {median_rate / GB:.2f} GB/s, "
                         f"{median_rate / memcpy_rate:.0%} of memcpy), p99 "
                         f"{latency['p99_us']:.0f} us; {measured['minor_page_faults']:,} minor "
                         f"faults, {measured['system_seconds']:.2f} s in the kernel{extra}")
    notes.append("GB/s counts batch bytes (headers included) per second; 'of memcpy' is "
                 "that rate over the same run's np.copyto rate. Goals (an append is one copy, a "
                 f"read a zero-copy view): append >= {APPEND_GOAL:.0%}, read >= "
                 f"{READ_GOAL:.0%} of memcpy; 'met' or 'below' says how this run did.")
    notes.append("A second read pass only walks batch headers (batches verified, views "
                 "returned), so it is not bounded by memory bandwidth.")
    notes.append("cpu/wall: this process's CPU time over wall time (below 1: it waited or "
                 "was preempted; above 1: a helper thread ran too). others: cores that "
                 "every other process (and the hypervisor's steal) kept busy meanwhile.")
    busy = [figure for figure in figures
            if figure["other_cores"] is not None and figure["other_cores"] > OTHER_CORES_WARNING]
    if busy:
        notes.append(f"WARNING: the machine was not quiet: other processes kept "
                     f"{max(figure['other_cores'] for figure in busy):.2f} cores busy during "
                     f"{len(busy)} of {len(figures)} measurements "
                     f"({', '.join(figure['name'] for figure in busy[:3])}"
                     f"{', ...' if len(busy) > 3 else ''}); on "
                     f"{env['cpu_affinity_count']} cores those figures are skewed low.")
    return {"environment": env, "arguments": vars(args), "batch_bytes": batch_bytes,
            "memcpy": memcpy, "populate": populate, "encode": encode, "appends": appends,
            "reads": reads, "figures": figures, "notes": notes}


# --- main ---------------------------------------------------------------------------

def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000,
                        help="records to append in each append variant, rounded up to whole "
                             "batches (default 10,000,000)")
    parser.add_argument("--record-size", type=int, default=100,
                        help="value bytes per record (default 100)")
    parser.add_argument("--batch-records", type=int, default=1000,
                        help="records per batch (default 1000)")
    parser.add_argument("--segment-bytes", type=int, default=1 << 30,
                        help="segment.bytes of the log (default 1 GiB)")
    parser.add_argument("--dir", default=None,
                        help="where the logs go (default: a temporary directory under /tmp, "
                             "removed at the end); the benchmark's own subdirectories in it "
                             "are replaced at the start and removed at the end")
    parser.add_argument("--keep", action="store_true",
                        help="leave the written logs in place")
    parser.add_argument("--json", default=os.path.join(REPOSITORY, "perf", "results",
                                                       "bench_log.json"),
                        help="where to write the results (default perf/results/bench_log.json)")
    args = parser.parse_args(argv)
    if args.records < 1 or args.record_size < 0 or args.batch_records < 1:
        parser.error("--records and --batch-records must be positive, --record-size >= 0")
    return args


def main(argv=None) -> int:
    args = parse_arguments(argv)
    created = args.dir is None
    base = tempfile.mkdtemp(prefix="shmlog-bench-") if created else args.dir
    os.makedirs(base, exist_ok=True)
    variants = ((1, False), (MULTI_BATCH_COUNT, False), (MULTI_BATCH_COUNT, True))
    directories = [os.path.join(base, f"append-{count}{'-ready' if ready else ''}")
                   for count, ready in variants]
    env = environment(base)
    try:
        print("warming up (numba compile or cache load) ...", flush=True)
        warm_up(args.record_size, args.segment_bytes)
        print("memcpy ...", flush=True)
        memcpy = measure_memcpy()
        print("encode ...", flush=True)
        values = [make_values(args.batch_records, args.record_size, SEED + i)
                  for i in range(DISTINCT_BATCHES)]
        batches, encode = measure_encode(values)
        log_bytes = -(-args.records // args.batch_records) * int(batches[0].size)
        print(f"populate new file pages ({log_bytes / 2**20:,.0f} MiB) ...", flush=True)
        populate_path = os.path.join(base, "populate.tmp")
        populate = populate_new_file(populate_path, log_bytes)
        appends = []
        for directory, (per_call, ready) in zip(directories, variants):
            print(f"append, {per_call} per call{', pages ready' if ready else ''}, "
                  f"into {directory} ...", flush=True)
            appends.append(measure_append(directory, batches, args.records, per_call,
                                          args.segment_bytes, prepopulate=ready))
            if directory != directories[0]:
                # Served its purpose; drop it so the page cache holds only what is read.
                shutil.rmtree(directory, ignore_errors=True)
        _remove(populate_path)
        print("read (spawned processes) ...", flush=True)
        reads = measure_reads(directories[0], args.segment_bytes, args.record_size)
        print(flush=True)
        report = build_report(args, env, memcpy, populate, encode, appends, reads,
                              int(batches[0].size))
        print_table(report)
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as target:
            json.dump(report, target, indent=2)
        print(f"\nwrote {args.json}")
    finally:
        if not args.keep:
            for directory in directories:
                shutil.rmtree(directory, ignore_errors=True)
            _remove(os.path.join(base, "populate.tmp"))
            if created:
                shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
