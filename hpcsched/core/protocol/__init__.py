"""The wire protocol: typed records, their encoding and field checks, and serialization."""
