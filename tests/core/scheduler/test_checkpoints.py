"""Result checkpoints: the scheduler's rewriting of annotated tasks, the files the tasks
write, and a cluster run twice with one checkpoint directory (the MPI job run again:
tests/hpc/test_mpi_checkpoint.py)."""

from __future__ import annotations

import os

import dask
import pytest

from hpcsched import Client, LocalCluster
from hpcsched.core import config
from hpcsched.core.protocol import messages as pr
from hpcsched.core.protocol.run_spec import Checkpoint, RunSpec
from hpcsched.core.scheduler.checkpoints import Checkpoints
from hpcsched.core.worker import checkpoint
from hpcsched.core.worker.execution import run_spec_call
from tests.launchers.counting import counted, runs


def graph(annotated: dict) -> pr.UpdateGraph:
    """a -> b (b depends on a), c alone."""
    spec = RunSpec(b"f", b"args", True)
    return pr.UpdateGraph("c1", {"a": {"run_spec": spec, "deps": []},
                                 "b": {"run_spec": spec, "deps": ["a"]},
                                 "c": {"run_spec": spec, "deps": []}},
                          ["b", "c"], annotations={"checkpoint": annotated})


@pytest.mark.timeout(30)
def test_an_annotated_task_keeps_its_result_or_reads_it(tmp_path):
    store = Checkpoints(str(tmp_path / "ck"))
    plain = graph({})
    assert store.rewrite(plain) is plain  # nothing annotated: the record as it came
    first = store.rewrite(graph({"b": True, "c": False}))
    kept = first.tasks["b"]["run_spec"]
    path = kept.checkpoint.path
    assert kept == RunSpec(b"f", b"args", True, Checkpoint(path, "b"))  # run, then keep
    assert first.tasks["b"]["deps"] == ["a"]
    assert first.tasks["a"] == graph({}).tasks["a"] and first.tasks["c"] == graph({}).tasks["c"]
    assert graph({}).tasks["b"]["run_spec"] == RunSpec(b"f", b"args", True)  # as received
    checkpoint.save(path, "b", 42)  # the task ran and kept its result
    again = store.rewrite(graph({"b": True}))
    assert again.tasks["b"] == {"run_spec": RunSpec(None, None, checkpoint=Checkpoint(path, "b", True)),
                                "deps": []}
    assert run_spec_call(again.tasks["b"]["run_spec"], {}) == 42  # read, not run
    assert store.loaded == 1


@pytest.mark.timeout(30)
def test_a_checkpoint_file_is_whole_and_names_its_key(tmp_path):
    path = str(tmp_path / "x.pkl")
    checkpoint.save(path, ("inc", 1), [1, 2])
    assert os.listdir(tmp_path) == ["x.pkl"]  # written aside, renamed into place
    assert checkpoint.load(path, ("inc", 1)) == [1, 2]
    with pytest.raises(checkpoint.CheckpointError, match=r"holds the result of \('inc', 1\)"):
        checkpoint.load(path, ("inc", 2))
    with pytest.raises(checkpoint.CheckpointError, match="was removed"):
        checkpoint.load(str(tmp_path / "gone.pkl"), "gone")


@pytest.mark.timeout(120)
def test_a_second_cluster_with_the_same_directory_runs_only_what_was_not_kept(tmp_path):
    """submit and map inside dask.annotate(checkpoint=True), and a dask.delayed made
    inside it: kept by the first cluster, read by the second; a task without the
    annotation runs both times."""
    done = tmp_path / "runs"
    done.mkdir()
    d = str(done)

    def campaign() -> list:
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          dashboard_address=None) as cluster, \
                Client(cluster, set_as_default=False) as client:
            with dask.annotate(checkpoint=True):
                kept = client.map(counted, range(5), directory=d)
                one = client.submit(counted, 10, directory=d)
                lazy = dask.delayed(counted)(20, directory=d, dask_key_name="lazy-20")
            plain = client.submit(counted, 30, directory=d)
            return client.gather([*kept, one, plain, client.compute(lazy)], timeout=60)

    with config.set({"scheduler.checkpoint-directory": str(tmp_path / "ck")}):
        assert campaign() == [0, 2, 4, 6, 8, 20, 60, 40]
        assert runs(done) == {**dict.fromkeys([0, 1, 2, 3, 4, 10, 20, 30], 1)}
        assert campaign() == [0, 2, 4, 6, 8, 20, 60, 40]
    assert runs(done) == {**dict.fromkeys([0, 1, 2, 3, 4, 10, 20], 1), 30: 2}
