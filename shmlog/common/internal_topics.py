"""The internal topics: the ones only the broker creates, writes, deletes or grows
(Kafka's internal topics).

Rules
-----
* A producer refuses to send to one, the appender refuses entries for one
  (``INTERNAL_TOPIC``) and the broker refuses to create, delete or grow one on
  request; the broker appends to them itself (committed offsets go to
  :data:`OFFSETS_TOPIC`, see ``groups.py``; transactions' states to
  :data:`TRANSACTION_STATE_TOPIC`, see ``broker/transaction_coordinator.py``).
* Clients import this module, so it imports nothing: the producer learns which
  topics are internal without loading the group coordinator.
"""

from __future__ import annotations

__all__ = ["OFFSETS_TOPIC", "TRANSACTION_STATE_TOPIC", "INTERNAL_TOPICS"]

# Where consumer groups' committed offsets are stored (Kafka's name).
OFFSETS_TOPIC = "__consumer_offsets"
# Where transaction coordinators keep their transactions' states (Kafka's name).
TRANSACTION_STATE_TOPIC = "__transaction_state"
# Topics only the broker creates, deletes or grows (Kafka's internal topics).
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})
