"""The controller, elected among the brokers, and its sans-I/O rules:
leader balance, preferred leader election, partition reassignment. Imports cluster.zk.
"""
