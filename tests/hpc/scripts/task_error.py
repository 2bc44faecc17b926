"""A task raises on a worker; the script catches it and the job still succeeds."""

from hpcsched import Client


def boom(x):
    raise ZeroDivisionError(f"task {x} failed on purpose")


with Client() as client:
    fut = client.submit(boom, 7)
    try:
        fut.result(timeout=30)
    except ZeroDivisionError as e:
        print(f"caught on the client: {e}", flush=True)
    else:
        raise AssertionError("the task should have failed")
    # the cluster is still fine after the error
    assert sum(client.gather(client.map(abs, range(-10, 0)))) == 55
    print(f"workers after the error: {len(client.scheduler_info()['workers'])}", flush=True)
