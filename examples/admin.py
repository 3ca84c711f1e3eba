"""Topic and group administration from Python: create a topic with configuration
overrides, describe it, change a setting, add partitions, list the groups, delete it.

    python examples/admin.py [DATA_DIR]

DATA_DIR is a running broker's data directory (default: $SHMLOG_DATA_DIR, else
shmlog's default). Every setting is described in docs/CONFIGURATION.md.
"""

from __future__ import annotations

import sys

from shmlog.client.admin import Admin


def main(data_dir: str | None) -> None:
    admin = Admin(data_dir)
    created = admin.create_topic("audit", 2, {"retention.ms": 3_600_000,
                                              "cleanup.policy": "delete"})
    print(f"created {created['name']} with {len(created['partitions'])} partitions")
    admin.alter_topic_config("audit", {"retention.ms": 86_400_000})
    admin.add_partitions("audit", 4)
    described = admin.describe_topic("audit")
    print(f"{described['name']}: {len(described['partitions'])} partitions, "
          f"retention.ms={described['config']['retention.ms']}")
    print(f"topics: {admin.list_topics()}")
    print(f"groups: {[group['group_id'] for group in admin.list_consumer_groups()]}")
    admin.delete_topic("audit")
    print(f"deleted audit; topics: {admin.list_topics()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
