"""A small Spark standalone cluster on this host: a master and N workers on loopback.

    python tools/spark_cluster.py run [--workers 2] -- COMMAND...   # start, run, stop
    python tools/spark_cluster.py start [--workers 2]                # leave it running
    python tools/spark_cluster.py stop
    python tools/spark_cluster.py run --workers 3 \
        --worker-bootstrap 127.0.0.2=DIR2 --worker-bootstrap 127.0.0.3=DIR3 ... -- COMMAND

The pip package of PySpark has no start-master.sh, so the daemons are started with
``spark-class`` (org.apache.spark.deploy.master.Master / worker.Worker). The master
listens on 127.0.0.1:7077; worker ``i`` binds 127.0.0.(i + 2), so every worker is a
separate executor host as far as Spark is concerned while all of them share this
machine - and its shmlog broker, which is what reading segments in place needs:
executors must run where the broker is. With a cluster of brokers on those same
addresses (``shmlog.devtools.local_cluster.LocalCluster`` with ``hosts``), ``--worker-bootstrap
HOST=DIR`` points the worker on HOST - and so its executors and their Python workers,
which inherit its environment - at its host's broker: ``SHMLOG_SPARK_BOOTSTRAP=DIR``
(``shmlog.spark.locality``). As a library (``start``), the master and the workers
may bind other addresses and be started under a command each (``ip netns exec NS``:
tools/spark_cluster_pipeline.py ``--namespaces`` runs each worker in the network
namespace of its host); every daemon's ``SPARK_LOCAL_IP`` is the address it binds,
so no JVM resolves this machine's host name to an address its namespace lacks.
The workers' Python is this interpreter
(PYSPARK_PYTHON), with the same compiled-kernel cache. ``run`` exports
SPARK_MASTER_URL to the command and always stops the cluster afterwards.
State (pid files, logs, work directories) lives under ``--state`` (default
.cache/spark-cluster).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPOSITORY)

from shmlog.common.child_process import process_alive  # noqa: E402
from shmlog.spark.locality import TASK_BOOTSTRAP_ENVIRONMENT as BOOTSTRAP_ENVIRONMENT  # noqa: E402

MASTER_HOST, MASTER_PORT = "127.0.0.1", 7077
MASTER_URL = f"spark://{MASTER_HOST}:{MASTER_PORT}"
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30


def spark_class() -> str:
    import pyspark
    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def environment(state: str, extra: dict | None = None) -> dict:
    env = {**os.environ, **(extra or {})}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("NUMBA_CACHE_DIR", os.path.join(REPOSITORY, ".cache", "numba"))
    env["SPARK_LOG_DIR"] = os.path.join(state, "logs")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPOSITORY, env.get("PYTHONPATH")]))
    return env


def master_url(host: str = MASTER_HOST) -> str:
    """The URL of a master listening on ``host``."""
    return f"spark://{host}:{MASTER_PORT}"


def daemon(state: str, name: str, arguments: list[str], extra: dict | None = None,
           launch_prefix: list[str] | None = None) -> None:
    """Start one daemon in the background (under ``launch_prefix``, which must exec
    it, so the pid file names the JVM), its output in logs/<name>.log, with the
    environment variables ``extra`` on top of ours."""
    os.makedirs(os.path.join(state, "logs"), exist_ok=True)
    with open(os.path.join(state, "logs", f"{name}.log"), "ab") as log:
        process = subprocess.Popen([*(launch_prefix or []), spark_class(), *arguments],
                                   stdout=log, stderr=subprocess.STDOUT,
                                   env=environment(state, extra),
                                   start_new_session=True)
    with open(os.path.join(state, f"{name}.pid"), "w") as target:
        target.write(str(process.pid))


def wait_for_port(host: str, port: int, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{what} did not listen on {host}:{port} within "
                                 f"{START_TIMEOUT_S} s (see its log)")
            time.sleep(0.5)


def worker_hosts(workers: int) -> list[str]:
    """The address worker ``i`` binds: 127.0.0.(i + 2)."""
    return [f"127.0.0.{index + 2}" for index in range(workers)]


def start(state: str, workers: int, cores: int, memory: str,
          bootstraps: dict[str, str] | None = None, *, hosts: list[str] | None = None,
          master_host: str = MASTER_HOST,
          launch_prefixes: dict[str, list[str]] | None = None) -> None:
    """Start the master (on ``master_host``) and the workers (on ``hosts``, default
    :func:`worker_hosts`); ``bootstraps`` maps a worker's host to the data directory
    of the broker there (its ``SHMLOG_SPARK_BOOTSTRAP``), ``launch_prefixes`` to the
    command it is started under. This process must reach every address (it waits
    for each daemon's port)."""
    hosts = hosts or worker_hosts(workers)
    for given, what in ((bootstraps, "--worker-bootstrap"), (launch_prefixes, "a launch prefix")):
        unknown = set(given or {}) - set(hosts)
        if unknown:
            raise SystemExit(f"{what} names {sorted(unknown)}, not worker hosts {hosts}")
    daemon(state, "master", ["org.apache.spark.deploy.master.Master", "--host", master_host,
                             "--port", str(MASTER_PORT), "--webui-port", "8080"],
           {"SPARK_LOCAL_IP": master_host})
    wait_for_port(master_host, MASTER_PORT, "the master")
    for index, host in enumerate(hosts):          # their JVMs start together
        extra = {"SPARK_LOCAL_IP": host}
        if host in (bootstraps or {}):
            extra[BOOTSTRAP_ENVIRONMENT] = bootstraps[host]
        daemon(state, f"worker-{index}", [
            "org.apache.spark.deploy.worker.Worker", master_url(master_host), "--host", host,
            "--port", str(7100 + index), "--webui-port", str(8081 + index),
            "--cores", str(cores), "--memory", memory,
            "--work-dir", os.path.join(state, f"work-{index}")], extra,
            (launch_prefixes or {}).get(host))
    for index, host in enumerate(hosts):
        wait_for_port(host, 7100 + index, f"worker {index}")
    print(f"spark standalone cluster: {master_url(master_host)}, {len(hosts)} workers",
          flush=True)


def exited(pid: int) -> bool:
    """Has process ``pid`` exited? A daemon this process started (``run``) stays a
    zombie, which signal 0 still finds, until it is reaped: it is reaped here."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:            # not our child: started by an earlier ``start``
        return not process_alive(pid)


def stop(state: str) -> None:
    """SIGTERM every daemon at once, then SIGKILL those still there after
    STOP_TIMEOUT_S."""
    if not os.path.isdir(state):
        return
    pids = {}
    for name in sorted(os.listdir(state)):
        if name.endswith(".pid"):
            with open(os.path.join(state, name)) as source:
                pids[os.path.join(state, name)] = int(source.read())
    for pid in pids.values():
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    waiting = set(pids.values())
    while waiting and time.monotonic() < deadline:
        waiting = {pid for pid in waiting if not exited(pid)}
        if waiting:
            time.sleep(0.2)
    for pid in waiting:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        exited(pid)
    for path in pids:
        os.unlink(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s {start,stop,run} [options] [-- COMMAND...]")
    parser.add_argument("action", choices=["start", "stop", "run"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="per worker")
    parser.add_argument("--memory", default="1g", help="per worker")
    parser.add_argument("--state", default=os.path.join(REPOSITORY, ".cache", "spark-cluster"))
    parser.add_argument("--worker-bootstrap", action="append", default=[], metavar="HOST=DIR",
                        help="the data directory of the broker on a worker's host")
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    state = os.path.abspath(args.state)
    if args.action == "stop":
        stop(state)
        return 0
    if any("=" not in entry for entry in args.worker_bootstrap):
        parser.error("--worker-bootstrap takes HOST=DIR")
    bootstraps = dict(entry.split("=", 1) for entry in args.worker_bootstrap)
    stop(state)                               # leftovers of an earlier start
    start(state, args.workers, args.cores, args.memory, bootstraps)
    if args.action == "start":
        return 0
    if not command:
        stop(state)
        raise SystemExit("run needs a command after --")
    try:
        return subprocess.call(command, env={**environment(state),
                                             "SPARK_MASTER_URL": MASTER_URL})
    finally:
        stop(state)


if __name__ == "__main__":
    sys.exit(main())
