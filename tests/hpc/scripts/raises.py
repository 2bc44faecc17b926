"""The script raises after using the cluster: every rank must exit non-zero, quickly."""

from hpcsched import Client

client = Client()
assert client.submit(sum, [1, 2]).result(timeout=30) == 3


def fail_here():
    raise ValueError("script failed on purpose")


fail_here()
