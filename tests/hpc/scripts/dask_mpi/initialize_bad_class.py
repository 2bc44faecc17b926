"""A worker_class that cannot speak hpcsched's protocol: every rank fails, clearly."""

from hpcsched import initialize

initialize(worker_class="collections.OrderedDict")
print("never reached", flush=True)
