"""What every layer shares: the error tree, the named limits, where a broker is found
and who may read it, settings checks, metrics, and the small records the clients pass
around. The lowest layer: it imports nothing of shmlog outside itself.
"""
