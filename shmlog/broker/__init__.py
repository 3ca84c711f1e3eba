"""One broker's work on its own host: the appender that drains the rings into the
logs, the partition host, the producer registry, the group coordinator (with its offsets
manager and its static members' rules), the control endpoint, and the services its
loop runs (topics, groups, producers). Imports every layer below it.
"""
