"""Kafka's wire protocol: a listener in the broker that unmodified Kafka clients
(librdkafka, the Java client, kafka-python, kcat, ...) produce to and fetch from.

Kafka's own split: ``socket_server`` is its ``SocketServer`` (framing, size limits,
idle connections), ``apis`` its ``KafkaApis`` (each request answered by API), both
on the broker's loop's thread, and ``codec`` the one door to the
message classes, which are kafka-python's (built from Kafka's JSON schemas). Batches
are converted at the edge (``record.kafka_batches``, compiled, nothing per record in
Python): Produce turns a client's record batch v2 into shmlog's layout for the
appender, and Fetch turns stored batches back into Kafka's, whose buffers the
hand-written response (``fetch_response``) passes to ``sendmsg`` without a copy.
Security is Kafka's four protocols per listener (``listeners``): TLS driven by the
socket server (``connections``, ``tls``), SASL logins before any other request
(``authenticator``, ``sasl``, ``credentials``), files checked as ``files`` says.
Transactions (``transaction_apis``) are the broker's transaction coordinator's,
and Fetch serves read_committed consumers below the last stable offset.
"""
