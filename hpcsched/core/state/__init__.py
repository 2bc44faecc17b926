"""The pure state machines and what they decide with: scheduler state and its components,
worker state, events, policies, order, fusion, graphs. No I/O, no threads, no clock."""
