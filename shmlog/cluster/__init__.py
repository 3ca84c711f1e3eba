"""What crosses hosts: a broker's membership of a cluster (node), consumer groups,
topics, producer ids and DeleteRecords across hosts, reassignment and status for operators;
``zk/`` (the ZooKeeper session and layout), ``controller/`` and ``replication/``
(``shmlog/zmq_replication.py``, the transport, belongs to it). Imports every layer below.
"""
