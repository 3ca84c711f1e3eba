"""ZooKeeper: a broker's session (the only importer of kazoo), every znode's path
and body, and a broker's picture of the cluster built from watch events.
"""
