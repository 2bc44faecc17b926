"""The book of a batch cluster's jobs, told as stories of events: no thread, no command.

Each story submits what the book asks for, feeds it the statuses a poll would find at
a given time, and checks what it decides.
"""

from __future__ import annotations

from hpcsched.jobqueue.base import JobStatus
from hpcsched.jobqueue.book import GONE_AFTER, MISSING_POLLS, Adjustment, Ending, JobBook
from hpcsched.jobqueue.job import Job, JobState

RUNNING = JobStatus(JobState.RUNNING, "R")
PENDING = JobStatus(JobState.PENDING, "PD")


def submit(book: JobBook, n: int, t: float = 0.0) -> list[Job]:
    """What the shell does for Adjustment(submit=n): job id "1" is named w-c0-0, ..."""
    jobs = []
    for _ in range(n):
        name = book.take_name()
        jobs.append(
            Job(
                str(book.next_index),
                name,
                f"/logs/{name}.out",
                book.workers_per_job,
                submit_time=t + book.next_index,
            )
        )
    book.add(jobs)
    return jobs


def test_a_target_asks_for_jobs_and_then_for_none_more() -> None:
    book = JobBook(workers_per_job=2, job_name="w", cluster_id="c0")
    assert book.set_target(3) is True
    assert book.adjustment() == Adjustment(submit=3)
    submit(book, 3)
    assert book.adjustment() == Adjustment()
    assert book.set_target(3) is False  # nothing more than is active
    assert book.worker_names(book.active()) == {f"w-c0-{i}-{k}" for i in range(3) for k in (0, 1)}


def test_excess_jobs_are_cancelled_pending_newest_first_then_running_with_fewest_workers() -> None:
    """Jobs 1, 2 run (2 has a worker), 3, 4 are pending: scaling to 1 keeps job 2."""
    book = JobBook(workers_per_job=2, job_name="w", cluster_id="c0")
    book.set_target(4)
    j1, j2, j3, j4 = submit(book, 4)
    book.apply_status(
        {"1": RUNNING, "2": RUNNING, "3": PENDING, "4": PENDING}, ["1", "2", "3", "4"], now=10.0
    )
    book.worker_joined("tcp://a:1", "w-c0-1-0")  # job 2's
    book.set_target(1)
    todo = book.adjustment()
    assert [j.job_id for j in todo.cancel] == ["4", "3", "1"]
    assert all(j.cancel_requested for j in todo.cancel) and not j2.cancel_requested
    assert book.adjustment() == Adjustment()  # marked: no longer active


def test_a_job_missing_from_the_queue_is_gone_only_after_polls_and_time() -> None:
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    book.set_target(1)
    (job,) = submit(book, 1)
    for poll in range(MISSING_POLLS):
        assert book.apply_status({}, ["1"], now=poll * 0.1) == []  # too soon to say
    assert not job.gone
    ended = book.apply_status({}, ["1"], now=GONE_AFTER)
    assert ended == [job] and job.gone and "1" not in book.live_ids
    assert book.settle(job) is Ending.FAILED and book.failed_jobs == [job]
    assert book.adjustment() == Adjustment(submit=1)  # replaced while the target asks


def test_a_cancelled_job_is_gone_at_once_and_is_no_failure() -> None:
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    book.set_target(1)
    (job,) = submit(book, 1)
    assert book.stop(["w-c0-0"]) == []  # no worker of it connected: nothing to stop by name
    book.set_target(0)
    assert book.adjustment().cancel == (job,)
    for poll in range(MISSING_POLLS):
        ended = book.apply_status({}, ["1"], now=float(poll))
    assert ended == [job] and job.state is JobState.CANCELLED
    assert book.settle(job) is Ending.CANCELLED and book.failed_jobs == []


def test_a_job_killed_by_our_cancel_reads_cancelled_not_failed() -> None:
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    book.set_target(1)
    (job,) = submit(book, 1)
    book.stop_all()
    book.apply_status({"1": JobStatus(JobState.FAILED, "F", 143)}, ["1"], now=1.0)
    assert job.state is JobState.CANCELLED


def test_workers_map_to_their_job_and_a_finished_job_is_no_failure() -> None:
    book = JobBook(workers_per_job=2, job_name="w", cluster_id="c0")
    book.set_target(1)
    (job,) = submit(book, 1)
    assert job.state is JobState.PENDING  # as the last poll said
    assert book.worker_joined("tcp://a:1", "w-c0-0-1") is job
    assert job.state is JobState.RUNNING  # its worker runs, before the next poll says so
    assert book.summary() == "1 running"
    assert book.worker_joined("tcp://a:2", "someone-else") is None
    assert book.connected() == 1
    assert book.sync_workers({"tcp://a:3": "w-c0-0-0"}) == ["w-c0-0-0"]  # a:1 left meanwhile
    assert job.workers == {"tcp://a:3": "w-c0-0-0"}
    book.worker_left("tcp://a:3")
    ended = book.apply_status({"1": JobStatus(JobState.DONE, "CD", 0)}, ["1"], now=5.0)
    assert ended == [job] and book.settle(job) is Ending.FINISHED


def test_stopping_workers_by_name_or_address_stops_their_whole_job_and_lowers_the_target() -> None:
    book = JobBook(workers_per_job=2, job_name="w", cluster_id="c0")
    book.set_target(2)
    j1, j2 = submit(book, 2)
    book.worker_joined("tcp://a:1", "w-c0-0-0")
    book.worker_joined("tcp://a:2", "w-c0-1-1")
    assert book.stop(["tcp://a:1", "w-c0-1-1"]) == [j1, j2]
    assert book.target_jobs == 0 and book.adjustment() == Adjustment()


def test_silent_jobs_are_those_running_long_with_no_worker_ever() -> None:
    book = JobBook(workers_per_job=1, job_name="w", cluster_id="c0")
    book.set_target(2)
    j1, j2 = submit(book, 2)
    book.apply_status({"1": RUNNING, "2": RUNNING}, ["1", "2"], now=100.0)
    book.worker_joined("tcp://a:1", "w-c0-1")  # job 2's
    assert book.silent(now=129.0, after=30.0) == []
    assert book.silent(now=130.0, after=30.0) == [j1]
    assert book.summary() == "2 running"
