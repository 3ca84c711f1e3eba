"""The package map holds: every module of shmlog has a layer, imports point down, and no
two packages import each other.

Goal: the tree shows the architecture (docs/ARCHITECTURE.md draws it), and stays that way.
A module imports its own package and the layers below it; packages that share a layer
are independent of each other; the import graph between packages has no cycle; and a
module added where no layer is named fails here until the map below names it.

Method: parse every ``.py`` file under ``shmlog/`` (nothing is imported, so nothing
runs) and resolve each import, at any depth (the lazy ones inside functions too), to
the shmlog module it names: ``from . import x`` names the module ``x`` when there is
one, else the package. Each module maps to its package (``shmlog.cluster.zk.client`` to
``cluster.zk``; a package's ``__init__`` is its module ``shmlog.cluster.zk.__init__``)
and each package to the layer of its first part. The checks run once on
the tree and once on small samples that break each rule, so a check that finds nothing
is known to be able to find something.

The light-client rule is kept here too: the modules of ``client/`` and ``kafka/`` reach,
through every import they make (lazy ones too), none of the broker's, the cluster's, the
wire protocol's or the server's packages, and none of the log's writer.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "shmlog"

# Lowest first. A package imports its own modules and the layers below; packages of
# one layer import each other not at all.
LAYERS = (
    ("common",),            # errors, limits, paths, access, settings, metrics
    ("native",),            # numba's configuration, atomics, CRC32C
    ("record", "shm"),      # the batch codec; shared memory, rings' and state layouts
    ("storage",),           # the log on disk
    ("protocol",),          # the control protocol and its client side
    ("client",),            # Producer, Consumer, reader, Admin
    ("config",),            # broker and cluster settings
    ("broker",),            # the appender, partition host, services
    ("cluster",),           # zk/, controller/, replication/, groups and topics across hosts
    ("wire",),              # Kafka's wire protocol: the listener and the APIs it serves
    ("server",),            # the composition root: Broker
    ("devtools",),          # local ZooKeeper and cluster, netns, perf
    ("kafka", "spark", "cli"),
)
# The four modules the design card names keep their paths, as the faces of their
# subsystems; each belongs to the package of the subsystem it faces.
FACES = {"shmlog.ring": "shm", "shmlog.segments": "storage", "shmlog.groups": "client",
         "shmlog.zmq_replication": "cluster.replication"}
# The package's own face (its names, imported lazily) and ``python -m shmlog``: above all.
TOP = {"shmlog.__init__", "shmlog.__main__"}

RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    return ".".join(path.relative_to(root.parent).with_suffix("").parts)


def package_of(module: str) -> str | None:
    """The package a module belongs to ("cluster.zk"), None for the top or no package."""
    if module in TOP:
        return None
    if module in FACES:
        return FACES[module]
    return ".".join(module.split(".")[1:-1]) or None


def imports_of(source: str, module: str, modules: set[str]) -> set[str]:
    """The shmlog modules ``source`` (the text of ``module``) imports, at any depth; a
    package imported is its ``__init__``."""
    def named(name: str) -> str:
        return f"{name}.__init__" if f"{name}.__init__" in modules else name

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(named(alias.name) for alias in node.names
                         if alias.name.split(".")[0] == "shmlog")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[:-node.level]
                source_name = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "shmlog":
                source_name = node.module
            else:
                continue
            for alias in node.names:
                submodule = named(f"{source_name}.{alias.name}")
                found.add(submodule if submodule in modules else named(source_name))
    found.discard(module)
    return found


def read_tree(root: pathlib.Path) -> dict[str, set[str]]:
    """{module: the shmlog modules it imports} for every module under ``root``."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    return {name: imports_of(path.read_text(), name, set(paths))
            for name, path in paths.items()}


def unplaced(graph: dict[str, set[str]]) -> list[str]:
    """Modules with no layer: a top-level module that is no face, a package the map
    does not name."""
    found = []
    for module in sorted(graph):
        package = package_of(module)
        if module in TOP:
            continue
        if package is None:
            found.append(f"{module}: a top-level module that is none of the faces "
                         f"({', '.join(sorted(FACES))})")
        elif package.split(".")[0] not in RANK:
            found.append(f"{module}: its package {package.split('.')[0]} has no layer")
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a higher layer, or of another package of the same layer."""
    found = []
    for module, targets in sorted(graph.items()):
        source = package_of(module)
        if source is None or source.split(".")[0] not in RANK:
            continue
        for target in sorted(targets):
            target_package = package_of(target)
            if target_package is None or target_package.split(".")[0] not in RANK:
                if target in TOP:
                    found.append(f"{module} imports {target}, the top of the tree")
                continue
            low, high = source.split(".")[0], target_package.split(".")[0]
            if low == high:
                continue
            if RANK[high] > RANK[low]:
                found.append(f"{module} ({low}) imports {target} ({high}): a higher layer")
            elif RANK[high] == RANK[low]:
                found.append(f"{module} ({low}) imports {target} ({high}): the same layer")
    return found


def package_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one package (Tarjan), sorted."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = package_of(module)
        if source is None:
            continue
        edges.setdefault(source, set())
        for target in targets:
            target_package = package_of(target)
            if target_package is not None and target_package != source:
                edges[source].add(target_package)
                edges.setdefault(target_package, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for after in sorted(edges[node]):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in on_stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(cycles)


@pytest.fixture(scope="module")
def tree() -> dict[str, set[str]]:
    graph = read_tree(PACKAGE)
    assert len(graph) > 50, f"only {len(graph)} modules found under {PACKAGE}"
    assert sum(map(len, graph.values())) > 400, "the imports were not resolved"
    return graph


def test_every_module_has_a_layer(tree):
    assert not unplaced(tree), "modules with no layer:\n" + "\n".join(unplaced(tree))


def test_every_import_points_down(tree):
    found = upward(tree)
    assert not found, "imports that point up or across a layer:\n" + "\n".join(found)


def test_no_two_packages_import_each_other(tree):
    cycles = package_cycles(tree)
    assert not cycles, "package cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_checks_find_what_they_look_for():
    sample = {
        "shmlog.common.limits": {"shmlog.storage.index_layout"},      # up
        "shmlog.record.records": {"shmlog.shm.state"},                # across one layer
        "shmlog.storage.index_layout": {"shmlog.common.limits"},      # down: fine
        "shmlog.cluster.node": {"shmlog.cluster.zk.client"},          # into a subpackage
        "shmlog.cluster.zk.client": {"shmlog.cluster.node"},          # ... and back: a cycle
        "shmlog.broker.stray": {"shmlog.__init__"},                   # the top
        "shmlog.stray": set(),                                        # no layer
        "shmlog.nowhere.module": set(),                               # no layer
    }
    assert upward(sample) == [
        "shmlog.broker.stray imports shmlog.__init__, the top of the tree",
        "shmlog.common.limits (common) imports shmlog.storage.index_layout (storage): "
        "a higher layer",
        "shmlog.record.records (record) imports shmlog.shm.state (shm): the same layer",
    ]
    assert package_cycles(sample) == [["cluster", "cluster.zk"], ["common", "storage"]]
    assert [line.split(":")[0] for line in unplaced(sample)] == [
        "shmlog.nowhere.module", "shmlog.stray"]


def test_imports_resolve_to_modules_at_any_depth():
    modules = {"shmlog.cluster.zk.client", "shmlog.cluster.zk.paths", "shmlog.common.errors",
               "shmlog.common.__init__", "shmlog.groups", "shmlog.cluster.zk.__init__",
               "shmlog.cluster.controller.__init__"}
    source = ("from ..zk import paths\n"
              "from ...common.errors import ShmlogError\n"
              "from .. import zk\n"
              "def later():\n"
              "    from shmlog import groups\n"
              "    import shmlog.common.errors\n")
    assert imports_of(source, "shmlog.cluster.controller.controller", modules) == {
        "shmlog.cluster.zk.paths", "shmlog.common.errors", "shmlog.groups",
        "shmlog.cluster.zk.__init__"}
    # in a package's __init__, one dot is the package itself
    assert imports_of("from . import zk\nfrom .zk.paths import x\n", "shmlog.cluster.__init__",
                      modules) == {"shmlog.cluster.zk.__init__", "shmlog.cluster.zk.paths"}


# --- the light clients ------------------------------------------------------------------
# What a user's process imports to produce, consume or administer (and kafka-python's
# names over them) loads none of the broker's side, none of the cluster's, and none of
# the log's writer: a consumer reads segments through the read path alone.
LIGHT = ("client", "kafka")
SERVER_SIDE = ("broker", "cluster", "wire", "server", "devtools")
WRITER = ("shmlog.segments", "shmlog.storage.log_segment", "shmlog.storage.local_log",
          "shmlog.storage.log_loader", "shmlog.storage.log_validator",
          "shmlog.storage.log_retention", "shmlog.storage.segment_append",
          "shmlog.storage.log_manager", "shmlog.storage.cleaner",
          "shmlog.storage.transaction_index")


def heavy_reached(graph: dict[str, set[str]], start: str) -> list[str]:
    """Every server-side or writer module ``start`` reaches through its imports (lazy
    ones too), each as the chain that reaches it."""
    came_from = {start: None}
    waiting = [start]
    while waiting:
        module = waiting.pop()
        for target in sorted(graph.get(module, ())):
            if target not in came_from:
                came_from[target] = module
                waiting.append(target)
    found = []
    for module in sorted(came_from):
        package = (package_of(module) or "").split(".")[0]
        if package in SERVER_SIDE or module in WRITER:
            chain = [module]
            while came_from[chain[-1]] is not None:
                chain.append(came_from[chain[-1]])
            found.append(" <- ".join(chain))
    return found


def test_the_clients_load_neither_the_broker_the_cluster_nor_the_writer(tree):
    clients = [module for module in tree if (package_of(module) or "").split(".")[0] in LIGHT]
    assert len(clients) > 15
    found = [chain for module in sorted(clients) for chain in heavy_reached(tree, module)]
    assert not found, "a client reaches the server's side:\n" + "\n".join(found)


def test_the_light_client_check_follows_chains():
    sample = {"shmlog.client.admin": {"shmlog.common.paths", "shmlog.storage.topic_config"},
              "shmlog.storage.topic_config": {"shmlog.storage.log_manager"},
              "shmlog.storage.log_manager": {"shmlog.segments"},
              "shmlog.client.reader": {"shmlog.storage.segment_read"}}
    assert heavy_reached(sample, "shmlog.client.admin") == [
        "shmlog.segments <- shmlog.storage.log_manager <- shmlog.storage.topic_config "
        "<- shmlog.client.admin",
        "shmlog.storage.log_manager <- shmlog.storage.topic_config <- shmlog.client.admin"]
    assert heavy_reached(sample, "shmlog.client.reader") == []
