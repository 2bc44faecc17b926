"""When a batch job's replacement is submitted: the rule of hpcsched/jobqueue/succession.py
applied by the book, told as stories on a fake clock (no thread, no batch command).

Each job's workers have ``LIFE`` seconds from their first connecting to the earliest
retirement; the queue makes each job wait ``wait`` seconds from submission to its first
worker. The book is asked every ``POLL`` seconds, as the cluster's poll thread does.
"""

from __future__ import annotations

import pytest

from hpcsched.jobqueue.book import Adjustment, JobBook
from hpcsched.jobqueue.job import Job, JobState
from hpcsched.jobqueue.succession import QueueWait, Succession, worker_life

LIFE, SLACK, POLL = 40.0, 10.0, 2.0
RULE = Succession(life=LIFE, slack=SLACK, max_lead=3600.0)


def submit(book: JobBook, n: int, now: float) -> list[Job]:
    """What the cluster does for Adjustment(submit=n) at ``now``: ids "1", "2", ..."""
    jobs = []
    for _ in range(n):
        name = book.take_name()
        jobs.append(Job(str(book.next_index), name, f"/logs/{name}.out", 1, submit_time=now))
    book.add(jobs)
    return jobs


def connect(book: JobBook, job: Job, now: float) -> None:
    job.state = JobState.RUNNING
    book.worker_joined(f"tcp://node:{job.job_id}", job.name, now)


def test_a_job_is_replaced_the_queue_wait_and_a_slack_before_its_workers_retire() -> None:
    """Submitted at 0, connected at 5 (a wait of 5): its workers retire from 45 on, so the
    replacement goes at 45 - (5 + 10) = 30, not before, and only once."""
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    book.set_target(1)
    (job,) = submit(book, book.adjustment().submit, now=0.0)
    connect(book, job, now=5.0)
    assert book.replace_ahead(29.0, RULE) == [] and book.adjustment() == Adjustment()
    assert book.replace_ahead(30.0, RULE) == [job]
    assert job.replaced and not job.cancel_requested  # it runs on until its workers retire
    assert book.leaving() == {job.name}  # adaptive counts it no more
    assert book.adjustment() == Adjustment(submit=1)
    (successor,) = submit(book, 1, now=30.0)
    assert book.replace_ahead(31.0, RULE) == []  # never twice; the successor is not due
    assert {j.job_id for j in book.active()} == {successor.job_id}


def test_nothing_is_replaced_before_anything_is_known_of_the_queue() -> None:
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    assert book.replace_ahead(100.0, RULE) == []  # no job at all
    book.set_target(1)
    (job,) = submit(book, 1, now=100.0)
    assert book.replace_ahead(100.0, RULE) == []  # waiting for 0 s: no reason yet


def test_a_job_still_waiting_is_replaced_when_the_queue_is_slower_than_a_job_lives() -> None:
    """No job has started yet, and the first has waited 30 s: a job that waits that long
    starts at 30 at the earliest and retires at 70, its successor (waiting as long) would
    connect at 30 + 30 + 10: due now."""
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    book.set_target(1)
    (job,) = submit(book, 1, now=0.0)
    assert book.replace_ahead(29.0, RULE) == []
    assert book.replace_ahead(30.0, RULE) == [job]


def test_a_user_stopping_a_replaced_job_keeps_its_replacement() -> None:
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    book.set_target(2)
    a, b = submit(book, 2, now=0.0)
    connect(book, a, 1.0), connect(book, b, 1.0)
    assert book.replace_ahead(40.0, RULE) == [a, b]
    submit(book, book.adjustment().submit, now=40.0)
    book.stop([a.name])  # e.g. adaptive scaling down the worker of a
    assert book.target_jobs == 2 and book.adjustment() == Adjustment()


def simulate(wait: float, target: int = 2, until: float = 1000.0,
             rule: Succession = RULE) -> tuple[list[int], int, int]:
    """The cluster's loop on a fake clock: each job's worker connects ``wait`` seconds
    after its submission and retires ``LIFE`` seconds later (its job ends).

    Returns the jobs with a connected worker at each poll once the first have connected,
    the most jobs ever waiting for their first worker, and the jobs submitted.
    """
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    book.set_target(target)
    serving: list[int] = []
    most_waiting = submitted = 0
    now = 0.0
    while now <= until:
        for job in list(book.live()):
            if job.connected_at is None and now >= job.submit_time + wait:
                connect(book, job, now)
            elif job.connected_at is not None and now >= job.connected_at + LIFE:
                book.worker_left(f"tcp://node:{job.job_id}")
                job.state = JobState.DONE
        book.replace_ahead(now, rule)
        new = book.adjustment().submit
        submit(book, new, now)
        submitted += new
        most_waiting = max(most_waiting, sum(j.connected_at is None for j in book.live()))
        if any(j.connected_at is not None for j in book.jobs.values()):
            serving.append(sum(bool(j.workers) for j in book.live()))
        now += POLL
    return serving, most_waiting, submitted


@pytest.mark.parametrize("wait", [5.0, 30.0, 80.0, 200.0])
def test_a_fixed_target_never_drops_below_itself_between_allocations(wait: float) -> None:
    """Whatever the queue's wait (shorter or much longer than a job's life), once the
    first jobs have connected there are always 2 jobs with workers; replacements overlap
    the jobs they replace by little (at most the slack and a poll or two), so the jobs
    submitted are about one per job's life per target job."""
    serving, _, submitted = simulate(wait)
    first_full = serving.index(2)
    assert min(serving[first_full:]) >= 2, serving
    assert max(serving) <= 4
    generations = 1000.0 / (LIFE - SLACK - 2 * POLL)
    assert submitted <= 2 * (generations + 1 + wait / LIFE)


def test_without_replacing_ahead_a_slow_queue_leaves_the_campaign_without_workers() -> None:
    """The same loop with replacements only once a job has ended: the control."""
    never = Succession(life=LIFE, slack=SLACK, max_lead=0.0)
    serving, _, _ = simulate(80.0, rule=never)
    assert 0 in serving[serving.index(2):]


def test_a_queue_that_starts_nothing_is_not_flooded() -> None:
    """No job ever starts: replacements of waiting jobs stop at the bound."""
    rule = Succession(life=LIFE, slack=SLACK, max_lead=120.0)
    _, most_waiting, _ = simulate(wait=1e9, until=5000.0, rule=rule)
    assert most_waiting == rule.max_unconnected(2) == 2 * (1 + 3)


def test_the_queue_wait_is_the_longest_of_the_recent_ones() -> None:
    waits = QueueWait(samples=2)
    for seconds in (100.0, 20.0, 30.0):
        waits.observe(seconds)
    assert waits.estimate([]) == 30.0  # 100 s has aged out
    assert waits.estimate([45.0]) == 45.0  # a job waiting longer


def test_the_workers_own_lifetime_arguments_set_the_life_of_a_job() -> None:
    """dask-jobqueue's idiom: worker_extra_args=["--lifetime", "55m", "--lifetime-stagger",
    "4m"]; the last one wins, as on the worker's command line."""
    assert worker_life(45, 7, ["--lifetime", "55m", "--lifetime-stagger", "4m"]) == 51 * 60
    assert worker_life(45, 7, ["--lifetime=00:30:00"]) == 30 * 60 - 7
    with pytest.raises(ValueError, match="lifetime"):
        worker_life(45, 7, ["--lifetime", "soon"])
