"""An installed wheel works on its own: ``shmlog.spark.session()`` compiles the bulk
reader from the Java sources the wheel ships, and both ``format("shmlog")`` and
``bulk_read`` read a topic a broker wrote; the wheel carries ``py.typed`` and the
LICENSE.

Method: copy the source tree to a temporary directory (so no build output lands in
the checkout), build a wheel there without build isolation (offline), install it
with ``--no-deps --no-index`` into a fresh venv outside the checkout whose
dependencies come from this interpreter's site-packages (a ``.pth`` line, which adds
the directory without running its ``.pth`` files, so the checkout's editable install
stays out). A script then runs in that venv from a directory outside the checkout,
without PYTHONPATH, with empty jar and kernel caches: it checks that ``shmlog`` (with
its broker module) was imported from the venv, writes a topic and reads it through
Spark both ways. The broker it writes to runs from the checkout: one from the
venv would first compile every broker kernel into the empty cache (half a minute,
the same code the rest of the suite runs). Bounded: every subprocess has a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from helpers import unlink_shared_memory
from shmlog import Broker

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Build output, caches and environments: never part of a source tree to build from.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", ".cache", "build", "dist", "*.egg-info",
                                     "__pycache__", ".pytest_cache", ".hypothesis",
                                     "demo-data", "results")
STEP_TIMEOUT_S = 300
RECORDS = 200

SCENARIO = textwrap.dedent("""
    import json, sys
    import shmlog, shmlog.server.broker
    from shmlog import Admin, Producer
    from shmlog.spark import bulk_read, session

    data_dir = sys.argv[2]
    Admin(data_dir).create_topic("events", 2)
    with Producer(data_dir) as producer:
        for number in range(int(sys.argv[1])):
            producer.send("events", b"value-%d" % number, key=b"key-%d" % (number % 5))
        producer.flush(timeout=60)
    spark = session("local[1]", "shmlog-wheel-test")
    try:
        frame = spark.read.format("shmlog").option("bootstrap", data_dir) \\
            .option("subscribe", "events").option("startingOffsets", "earliest").load()
        python_values = sorted(row.value.decode() for row in frame.select("value").collect())
        bulk = bulk_read(spark, bootstrap=data_dir, subscribe="events",
                         startingOffsets="earliest")
        bulk_values = sorted(row.value.decode() for row in bulk.select("value").collect())
    finally:
        spark.stop()
    print(json.dumps({"module": shmlog.__file__, "broker": shmlog.server.broker.__file__,
                      "prefix": sys.prefix, "python": python_values, "bulk": bulk_values}))
""")


def run(arguments, **options):
    done = subprocess.run(arguments, capture_output=True, text=True, timeout=STEP_TIMEOUT_S,
                          **options)
    assert done.returncode == 0, f"{arguments} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture
def wheel(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(CHECKOUT, source, ignore=NOT_SOURCES)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--quiet", "-w", str(tmp_path / "wheels"), str(source)])
    (built,) = (tmp_path / "wheels").iterdir()
    return built


def test_the_wheel_ships_the_java_sources_the_marker_and_the_license(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {os.path.relpath(os.path.join(root, name), CHECKOUT)
               for root, _, files in os.walk(os.path.join(CHECKOUT, "shmlog", "spark", "jvm"))
               for name in files if name.endswith(".java")}
    assert shipped and shipped <= set(names)
    assert "shmlog/py.typed" in names
    assert any(name.endswith(".dist-info/LICENSE") for name in names)


@pytest.mark.timeout(900)
def test_an_installed_wheel_reads_a_topic_through_spark_both_ways(wheel, tmp_path):
    # Nothing of the checkout's: with it on PYTHONPATH (its shmlog.egg-info), pip
    # would find shmlog installed already and install nothing.
    variables = {key: value for key, value in os.environ.items()
                 if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON",
                                "PYSPARK_DRIVER_PYTHON")}
    environment = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(environment)], env=variables)
    python = str(environment / "bin" / "python")
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--disable-pip-version-check", str(wheel)], env=variables)
    site_packages = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        env=variables).stdout.strip()
    with open(os.path.join(site_packages, "dependencies.pth"), "w") as pth:
        pth.write(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "work"
    work.mkdir()
    variables.update(SHMLOG_CACHE_DIR=str(tmp_path / "jars"),
                     NUMBA_CACHE_DIR=str(tmp_path / "kernels"))
    try:
        with Broker(str(tmp_path / "data")) as broker:
            done = run([python, "-c", SCENARIO, str(RECORDS), broker.data_dir], cwd=work,
                       env=variables)
    finally:
        unlink_shared_memory(tmp_path / "data")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for module in (result["module"], result["broker"]):
        assert os.path.commonpath([module, str(environment)]) == str(environment)
    assert result["prefix"] == str(environment)
    expected = sorted(f"value-{number}" for number in range(RECORDS))
    assert result["python"] == expected
    assert result["bulk"] == expected
    assert os.listdir(tmp_path / "jars"), "the bulk reader was not compiled"
