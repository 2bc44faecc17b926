"""RootBlocks alone: which queued task a worker takes (see hpcsched.core.state.blocks).

The stories of SchedulerState (tests/core/state/test_scheduler_state.py) drive the blocks
through events; these check the rules on hand-made tasks.
"""

from __future__ import annotations

from hpcsched.core.state.blocks import RootBlocks
from hpcsched.core.state.model import TaskGroup, TaskState, WorkerInfo


def results_of(tg: TaskGroup, nbytes: int, n: int = 1) -> None:
    """What the scheduler counts when ``n`` tasks of the group finish."""
    tg.nbytes_total += nbytes * n
    tg.n_nbytes += n


def queued(blocks: RootBlocks, n: int, generation: int = 1, user: int = 0,
           threads: int = 2, name: str = "x", nbytes: int | None = 8) -> list[TaskState]:
    """``n`` tasks of a new group queued in order; ``nbytes``: the size of a result of
    the group already known (None: none finished yet)."""
    tg = TaskGroup(name)
    tg.n_tasks = n
    if nbytes is not None:
        results_of(tg, nbytes)
    out = []
    for i in range(n):
        ts = TaskState(f"{name}-{i}", None, tg)
        ts.state = "queued"
        ts.priority = (generation, -user, i)
        blocks.add(ts, threads)
        out.append(ts)
    return out


def leave(ts: TaskState) -> None:
    """What SchedulerState.transition does when a task leaves the queue."""
    ts.state = "processing"
    ts.block = None


def test_blocks_hold_tasks_over_threads_at_most_the_limit():
    blocks = RootBlocks(4)
    tasks = queued(blocks, 20)
    assert [len(b.tasks) for _, _, b in sorted(blocks.free, key=lambda e: e[1])] == [4] * 5
    small = RootBlocks(32)
    queued(small, 6, threads=2)  # 6 tasks over 2 threads: blocks of 3
    assert sorted(len(b.tasks) for _, _, b in small.free) == [3, 3]
    off = RootBlocks(1)
    assert all(ts.block is None for ts in queued(off, 20)) and not off.free
    assert all(ts.block is not None for ts in tasks)


def test_a_worker_takes_its_block_in_order_then_claims_the_next():
    blocks = RootBlocks(4)
    tasks = queued(blocks, 12)
    a, b = WorkerInfo("tcp://a", 1), WorkerInfo("tcp://b", 1)
    got = {a: [], b: []}
    for ws in [a, a, a, a, b, b, a, a, b, b]:
        ts = blocks.take(ws, head=None)
        assert ts is not None
        got[ws].append(int(ts.key.split("-")[1]))
        leave(ts)
    assert got[a] == [0, 1, 2, 3, 8, 9]
    assert got[b] == [4, 5, 6, 7]
    assert a.root_block is tasks[10].block is not None
    # every block is claimed or used up: b is to take the queue's best task instead
    assert blocks.take(b, head=tasks[10]) is None
    assert b.root_block is None and blocks.owned == {a.root_block}
    assert [t.key for t in tasks if t.block is not None] == ["x-10", "x-11"]


def test_a_block_gives_way_to_an_earlier_submission_or_a_higher_user_priority():
    blocks = RootBlocks(4)
    a = WorkerInfo("tcp://a", 1)
    later = queued(blocks, 8, generation=2, name="later")
    ts = blocks.take(a, head=later[0])
    assert ts is later[0]
    leave(ts)
    earlier = queued(blocks, 8, generation=1, name="earlier")
    # the queue's best task is now of an earlier submission: a takes it, not its block
    assert blocks.take(a, head=earlier[0]) is earlier[0]
    assert a.root_block is earlier[0].block
    leave(earlier[0])
    urgent = queued(blocks, 8, generation=1, user=5, name="urgent")
    assert blocks.take(a, head=urgent[0]) is urgent[0]
    leave(urgent[0])
    b, c = WorkerInfo("tcp://b", 1), WorkerInfo("tcp://c", 1)
    assert blocks.take(b, head=urgent[1]) is urgent[4]  # the next unclaimed block
    # the blocks a let go are claimed again, from where they stopped, best first
    assert blocks.take(c, head=urgent[1]) is None  # urgent's first block is a's
    assert blocks.take(c, head=earlier[1]) is earlier[1]
    assert blocks.take(WorkerInfo("tcp://d", 1), head=earlier[4]) is earlier[4]
    assert blocks.take(WorkerInfo("tcp://e", 1), head=later[1]) is later[1]


def test_a_block_gives_way_to_better_work_no_block_has_claimed():
    blocks = RootBlocks(4)
    a, b = WorkerInfo("tcp://a", 1), WorkerInfo("tcp://b", 1)
    roots = queued(blocks, 8, name="root")
    leave(blocks.take(a, None))
    first_of_b = blocks.take(b, None)
    assert first_of_b is roots[4]
    # b's block holds better work than a's, but it is b's: a keeps to its own
    assert blocks.take(a, head=roots[5]) is roots[1]
    # a dependent queued later with a better priority, in no worker's block: it goes first
    dep = TaskState("dep-0", None, roots[0].group)
    dep.state, dep.priority = "queued", (1, 0, -1)
    assert blocks.take(a, head=dep) is None
    blocks.took_head(a, dep, {a.address: a, b.address: b})
    assert a.root_block is None  # it has no block to take over
    # a's block was let go and is claimed again from where it stopped
    leave(roots[1])
    assert blocks.take(a, head=roots[2]) is roots[2]


def test_took_head_claims_the_block_of_a_gone_owner_only():
    blocks = RootBlocks(4)
    tasks = queued(blocks, 8)
    a, b, c = (WorkerInfo(f"tcp://{n}", 1) for n in "abc")
    leave(blocks.take(a, None))
    workers = {a.address: a, b.address: b, c.address: c}
    blocks.took_head(b, tasks[1], workers)
    assert b.root_block is None  # a still runs: its block stays a's
    del workers[a.address]
    blocks.took_head(b, tasks[1], workers)
    assert b.root_block is tasks[1].block and tasks[1].block.owner is b
    assert a.root_block is None


def test_clear_lets_go_of_every_task():
    blocks = RootBlocks(4)
    tasks = queued(blocks, 8)
    a = WorkerInfo("tcp://a", 1)
    blocks.take(a, None)
    blocks.clear()
    assert not blocks.free and not blocks.owned and blocks.filling is None
    assert a.root_block is not None and not a.root_block.tasks
    for ts in tasks:
        leave(ts)
    assert blocks.take(a, None) is None and a.root_block is None


def test_results_over_half_the_byte_bound_make_blocks_smaller_then_none():
    blocks = RootBlocks(4, max_bytes=1000)
    first = queued(blocks, 20, name="x", nbytes=None)
    assert blocks.size_for(first[0], 2) == 4  # no result known: the size limit alone
    results_of(first[0].group, 300)
    assert blocks.size_for(first[0], 2) == 3  # 3 x 300 bytes fit in 1000
    results_of(first[0].group, 900, n=3)  # mean 750
    assert blocks.size_for(first[0], 2) == 1
    large = RootBlocks(4, max_bytes=1000)
    tasks = queued(large, 20, name="z", nbytes=750)
    assert not large.free and all(ts.block is None for ts in tasks)  # queued as in dask


def test_blocks_wait_for_a_first_small_result_and_end_with_large_ones():
    """Blocks are cut before any result is known; a worker claims one only once the
    group's results are known to be small, and lets it go if they turn out large."""
    blocks = RootBlocks(4, max_bytes=1000)
    tasks = queued(blocks, 12, nbytes=None)
    tg = tasks[0].group
    a, b = WorkerInfo("tcp://a", 1), WorkerInfo("tcp://b", 1)
    workers = {a.address: a, b.address: b}
    # nothing known: a takes the queue's best task, as with dask's queuing
    assert blocks.take(a, head=tasks[0]) is None
    blocks.took_head(a, tasks[0], workers)
    assert a.root_block is None and not blocks.owned
    leave(tasks[0])
    results_of(tg, 100)
    assert blocks.take(a, head=tasks[1]) is tasks[1] and a.root_block is tasks[1].block
    leave(tasks[1])
    results_of(tg, 1500)  # mean 800: too large for blocks
    assert blocks.take(a, head=tasks[2]) is None
    assert a.root_block is None and not blocks.owned
    blocks.took_head(a, tasks[2], workers)
    assert a.root_block is None  # nor does taking the head claim one
    leave(tasks[2])
    assert blocks.take(b, head=tasks[3]) is None and b.root_block is None
    results_of(tg, 0, n=30)  # mean 50: small again, blocks again
    assert blocks.take(b, head=tasks[3]) is tasks[3] and b.root_block is tasks[3].block
