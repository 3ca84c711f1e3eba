"""Replication: its sans-I/O rules (``rules``, ``purgatory``), its messages, their codec
and frame layout (``messages``, ``codec``, ``layout``), throttling, one partition's part
in it (``partition``), the replica service on the broker's loop (``replica_service``,
composed of ``hosted_replicas``, ``fetcher``, ``fetch_serving``, ``isr_manager``,
``delete_records_serving`` and ``dispatch``), forwarding of produce requests to leaders,
and the high-watermark checkpoint. Imports cluster.zk.
"""
