"""The controller, elected among the brokers: its event handling (``controller``), its
jobs (``partition_state_machine``, ``partition_reassigner``,
``preferred_leader_elector``, sharing ``controller_context``), their sans-I/O rules
(leader balance, partition reassignment), and the operator's preferred leader
election. Imports cluster.zk.
"""
