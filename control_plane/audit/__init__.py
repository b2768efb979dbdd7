"""The audit log: events written in the transaction of the change they record, read through
filtered keyset listings and streamed exports, and kept in monthly partitions (SPEC.md 2 "Audit
event", 4, 8, 9)."""
