"""For development, tests and benchmarks: a local ZooKeeper, a cluster on one
machine, network namespaces, the perf tools, and compiling every kernel ahead.
"""
