"""Cluster tests and the harness they stand on.

* ``history.py``: the offset-based history checker (what clients saw and what the
  replicas hold, checked against Kafka's replication promises);
* ``conftest.py``: the ``topology`` fixture: network namespaces (``shmlog.devtools.netns``),
  cut and healed with drop rules inside them only (skipped, with the reason, without
  root, ``ip`` or ``nft``).

A package, so its modules are imported as ``cluster.history`` and ``cluster.workload``
(``tests/`` is on the path, as for ``helpers``). Select these tests by path:
``pytest tests/cluster``.
"""
