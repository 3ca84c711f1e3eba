"""A Spark session ready for shmlog: ``format("shmlog")`` registered, Python workers
running this interpreter, and the bulk reader's jar when it can be compiled."""

from __future__ import annotations

import os
import shutil
import sys

from pyspark.sql import SparkSession

from ..common.errors import ShmlogError
from .bulk import session_settings
from .data_source import register

__all__ = ["session"]


def session(master: str = "local[2]", app_name: str = "shmlog", **conf):
    """A Spark session with ``format("shmlog")`` registered, whose Python workers run
    this interpreter (and find the same compiled-kernel cache), and with the bulk
    reader of :func:`bulk_read` when it can be compiled (a warning says why not).

    Raises
    ------
    ShmlogError
        No Java runtime is installed (Spark needs Java 17 or later).
    """
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ShmlogError("Spark needs a Java runtime (17 or later): install one (e.g. apt "
                          "install openjdk-17-jre-headless) or set JAVA_HOME")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {"spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": "4"}
    if os.environ.get("NUMBA_CACHE_DIR"):
        settings["spark.executorEnv.NUMBA_CACHE_DIR"] = os.environ["NUMBA_CACHE_DIR"]
    settings.update(session_settings(conf.pop("spark.jars", None)))
    settings.update(conf)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
