"""The transport-independent core: state machines, policies, servers, client."""
