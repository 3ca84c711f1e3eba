"""Every limit lives in ``shmlog/common/limits.py``, with the reason for its number.

Goal: a reader finds every bound of shmlog (a queue, batch, buffer, retry, wait, poll,
interval or default) in one module, each with a comment saying where its number comes
from; a limit written as a module constant anywhere else fails here.

Method: parse every module of shmlog but ``limits`` and the binary layouts (whose
numbers are formats, not limits: ``*layout.py``) without importing them, and report
each module-level assignment of a number (a literal, or arithmetic of literals) to a
name that reads as a limit: one that ends in a unit or a bound (``_S``, ``_MS``,
``_BYTES``, ``_SIZE``, ``_MAX``, ``_MIN``, ``_COUNT``, ``_ATTEMPTS``, ``_DEFAULT``,
...). A few such names are facts of a format or of the system rather than choices;
they are listed below with their reason. In ``limits``, each limit has a comment.
"""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "shmlog"
LIMITS = PACKAGE / "common" / "limits.py"

LIMIT_NAME = re.compile(r"_(S|MS|US|NS|HOURS|BYTES|KIB|MIB|SIZE|LENGTH|MAX|MIN|COUNT|"
                        r"ATTEMPTS|RETRIES|INTERVAL|TIMEOUT|CAPACITY|DEPTH|DEFAULT|LIMIT)"
                        r"(_[A-Z]+)?$")

# Numbers named like limits that are facts, not choices: a format's field width, the
# kernel's, or an algorithm's shape. {(module, name): why it stays}
FACTS = {
    ("shmlog.storage.topic_config", "LONG_MAX"): "Java's long, Kafka's config bound",
    ("shmlog.common.paths", "SOCKET_PATH_LENGTH_MAX"): "sun_path holds 107 bytes and a NUL",
    ("shmlog.storage.leader_epochs", "EPOCH_MAX"): "the batch header's epoch is an i32",
    ("shmlog.cluster.zk.paths", "PRODUCER_ID_MAX"): "a producer id is an i64",
    ("shmlog.cluster.zk.paths", "BROKER_ID_MAX"): "a broker id is an i32",
    ("shmlog.cluster.zk.paths", "PRODUCER_ID_BLOCK_SIZE"): "Kafka's block of ids in ZooKeeper",
    ("shmlog.devtools.zookeeper", "PORT_MAX"): "a TCP port is a u16",
    ("shmlog.devtools.zookeeper", "PORT_DEFAULT"): "ZooKeeper's own client port",
    ("shmlog.config.cluster", "_PORT_MAX"): "a TCP port is a u16",
    ("shmlog.config.cluster", "_INT_MAX"): "Kafka's int settings are i32",
    ("shmlog.cluster.replication.messages", "INT32_MAX"): "a frame's i32 field",
    ("shmlog.cluster.replication.messages", "INT64_MIN"): "a frame's i64 field",
    ("shmlog.cluster.replication.messages", "INT64_MAX"): "a frame's i64 field",
    ("shmlog.cluster.replication.rules", "NEVER_MS"): "a sentinel time, not a bound",
    ("shmlog.zmq_replication", "_I32_MAX"): "a frame's i32 field",
    ("shmlog.storage.cleaner", "ENTRY_SIZE"): "the offset map's slot layout",
    ("shmlog.storage.cleaner", "_GROUP_OFFSET_SPAN_MAX"): "the offset index's u32 positions",
    ("shmlog.native.crc32c", "LANE_LONG_SIZE"): "the interleaved CRC's lane shape",
    ("shmlog.native.crc32c", "LANE_SHORT_SIZE"): "the interleaved CRC's lane shape",
    ("shmlog.record.columns", "FIELD_RUN_RECORDS_MIN"): "where one decoding path beats another",
    ("shmlog.wire.error_codes", "INVALID_SESSION_TIMEOUT"): "Kafka's error code 26, a name",
    ("shmlog.wire.error_codes", "INVALID_TRANSACTION_TIMEOUT"): "Kafka's error code 50, a name",
}


def is_number(node: ast.expr) -> bool:
    """A literal number, or arithmetic, shifts and unary signs of literal numbers."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return is_number(node.left) and is_number(node.right)
    return False


def stray_limits(source: str, module: str) -> list[str]:
    """The limits ``source`` defines at module level, as "module.NAME = value"."""
    found = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
        for target in targets:
            if isinstance(target, ast.Name) and LIMIT_NAME.search(target.id) \
                    and is_number(node.value) and (module, target.id) not in FACTS:
                found.append(f"{module}.{target.id} = {ast.unparse(node.value)}")
    return found


def module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def test_the_scan_finds_a_limit_and_nothing_else():
    sample = ("import os\n"
              "POLL_MS = 100\n"
              "RING_SIZE_DEFAULT = 16 << 20\n"
              "WAIT_S: float = -1.5e-3\n"
              "ROW_HEADER = 3\n"
              "NAME_MAX = os.pathconf('/', 'PC_NAME_MAX')\n"
              "def f():\n"
              "    LOCAL_MS = 5\n")
    assert stray_limits(sample, "m") == ["m.POLL_MS = 100", "m.RING_SIZE_DEFAULT = 16 << 20",
                                         "m.WAIT_S = -0.0015"]


def test_every_limit_is_in_limits():
    modules = [path for path in sorted(PACKAGE.rglob("*.py"))
               if path != LIMITS and not path.name.endswith("layout.py")]
    assert len(modules) > 50
    found = [line for path in modules
             for line in stray_limits(path.read_text(), module_name(path))]
    assert not found, "limits outside shmlog/common/limits.py:\n" + "\n".join(found)


def test_every_limit_in_limits_says_why():
    """Each limit is preceded by a comment, or shares the comment of the block it is
    in (no blank line between them)."""
    lines = LIMITS.read_text().splitlines()
    bare = []
    for number, line in enumerate(lines):
        name = line.split("=")[0].strip()
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or line.startswith((" ", "#")):
            continue
        above = number - 1
        while above >= 0 and lines[above].strip() and not lines[above].startswith("#"):
            above -= 1
        if above < 0 or not lines[above].startswith("#"):
            bare.append(f"limits.py:{number + 1}: {name}")
    assert not bare, "limits without a reason:\n" + "\n".join(bare)
