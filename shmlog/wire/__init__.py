"""Kafka's wire protocol (Kafka's ``kafka.network`` and ``KafkaApis``): unmodified Kafka
clients produce to and consume from shmlog over TCP. ``listeners`` reads where the
broker listens and with which security protocol, ``sasl`` and ``credentials`` log
clients in (PLAIN, SCRAM-SHA-256/512), ``tls`` makes the server's TLS context; each is
free of I/O but for reading its files, so the socket server composes them. Imports
every layer below (it sits between cluster and server).
"""
