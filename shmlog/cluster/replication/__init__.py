"""Replication: its sans-I/O rules and messages, their frame layout,
throttling, one partition's part in it, the replica service on the broker's loop, forwarding
of produce requests to leaders, and the high-watermark checkpoint. Imports cluster.zk.
"""
