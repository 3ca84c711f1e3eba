"""The composition root: ``Broker``, which wires the layers below into one process,
with its stats request and its Prometheus endpoint.
"""
