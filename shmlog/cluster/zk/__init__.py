"""ZooKeeper: a broker's session (``session``, the only importer of kazoo), every
znode's path and body (``paths``), what the session reads and writes by part
(``brokers``, ``topics``, ``controller_election``, ``configs``, ``producer_id_blocks``,
``admin``), the watches and their events (``watches``, ``events``), all held by
``client.ClusterZooKeeper``, and a broker's picture of the cluster built from watch
events (``view``).
"""
