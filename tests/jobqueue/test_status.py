"""Status parsing from captured outputs (SLURM 22.05 and Grid Engine 8.1.9 on this
machine; PBS Pro / LSF documentation formats), job-id parsing, accounting fallbacks,
and cancel error handling -- all through a replaced ``run_command``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsched.jobqueue.job import JobState
from hpcsched.jobqueue.runner import BatchCommandError, BatchCommandTimeout
from hpcsched.jobqueue.systems.lsf import LSFSystem
from hpcsched.jobqueue.systems.pbs import PBSSystem
from hpcsched.jobqueue.systems.sge import SGESystem, parse_qacct
from hpcsched.jobqueue.systems.slurm import SLURMSystem, expand_ranges, parse_exit_code

DATA = Path(__file__).parent / "data"
P, R, D, F, C, U = (JobState.PENDING, JobState.RUNNING, JobState.DONE, JobState.FAILED,
                    JobState.CANCELLED, JobState.UNKNOWN)


def data(name: str) -> str:
    return (DATA / name).read_text()


class FakeRunner:
    """Answers commands by their first words; records every call."""

    def __init__(self, answers: dict[str, object]):
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, cmd, timeout, env=None, input=None):  # noqa: A002
        self.calls.append(list(cmd))
        for prefix, answer in self.answers.items():
            if " ".join(cmd).startswith(prefix):
                if isinstance(answer, BaseException):
                    raise answer
                return answer
        raise AssertionError(f"unexpected command {cmd}")


def system(cls, answers):
    s = cls(cores=1, memory="1GB", log_directory="/tmp")
    s.run_command = FakeRunner(answers)
    return s


def err(stderr: str, code: int = 1, stdout: str = "") -> BatchCommandError:
    return BatchCommandError("failed", cmd=["x"], returncode=code, stdout=stdout, stderr=stderr)


# ---------------------------------------------------------------- job ids

@pytest.mark.parametrize("cls,output,job_id", [
    (SLURMSystem, "42\n", "42"),
    (SLURMSystem, "42;cluster2\n", "42"),
    (SGESystem, "3\n", "3"),
    (SGESystem, "3.1-4:1\n", "3"),
    (PBSSystem, "1234.pbs-head\n", "1234.pbs-head"),
    (PBSSystem, "1238[].pbs-head\n", "1238[].pbs-head"),
    (PBSSystem, "1234\n", "1234"),  # Torque wrappers over SLURM print no server
    (LSFSystem, "Job <1234> is submitted to queue <normal>.\n", "1234"),
    (LSFSystem, "Job <99> is submitted to default queue <normal>.\n", "99"),
])
def test_job_id_parsing(cls, output, job_id):
    assert cls.parse_job_id(output) == job_id


@pytest.mark.parametrize("cls", [SLURMSystem, SGESystem, PBSSystem, LSFSystem])
def test_unparsable_submit_output_is_an_error_showing_it(cls):
    with pytest.raises(BatchCommandError, match="could not find a job id.*\n.*queue full"):
        cls.parse_job_id("Request rejected: queue full\n")


def test_array_element_ids():
    assert SLURMSystem(cores=1, memory="1GB").array_element_ids("42", 3) == ["42_0", "42_1", "42_2"]
    assert SGESystem(cores=1, memory="1GB").array_element_ids("3", 2) == ["3.1", "3.2"]
    assert PBSSystem(cores=1, memory="1GB").array_element_ids("7[].srv", 2) == ["7[0].srv", "7[1].srv"]
    assert LSFSystem(cores=1, memory="1GB").array_element_ids("9", 2) == ["9[1]", "9[2]"]


def test_ranges():
    assert expand_ranges("2-3") == [2, 3]
    assert expand_ranges("1,4-6%2") == [1, 4, 5, 6]
    assert expand_ranges("1-7:2") == [1, 3, 5, 7]
    assert parse_exit_code("3:0") == 3 and parse_exit_code("0:15") == 143
    assert parse_exit_code("junk") is None


# ---------------------------------------------------------------- SLURM

def test_slurm_squeue_capture():
    a, b, c = data("slurm-ids.txt").split()
    s = SLURMSystem(cores=1, memory="1GB")
    found = s.parse_status(data("slurm-squeue.txt"))
    assert {k: v[0] for k, v in found.items()} == {
        a: "RUNNING", b: "FAILED", f"{c}_0": "RUNNING", f"{c}_1": "RUNNING",
        f"{c}_2": "PENDING", f"{c}_3": "PENDING"}
    after = s.parse_status(data("slurm-squeue-after-cancel.txt"))
    assert {s.to_state(*v) for k, v in after.items() if k != b} == {C}


def test_slurm_status_one_command_for_all_jobs_arrays_by_parent():
    a, b, c = data("slurm-ids.txt").split()
    s = system(SLURMSystem, {"squeue": data("slurm-squeue.txt"),
                             f"scontrol show job {b}": data("slurm-scontrol-failed.txt")})
    ids = [a, b, f"{c}_0", f"{c}_3"]
    st = s.status(ids)
    # squeue has no exit code: scontrol is asked about the failed job only
    assert s.run_command.calls == [["squeue", "-h", "-t", "all", "-j", f"{a},{b},{c}", "-o", "%i %T"],
                                   ["scontrol", "show", "job", b]]
    assert {k: v.state for k, v in st.items()} == {a: R, b: F, f"{c}_0": R, f"{c}_3": P}
    assert st[b].exit_code == 3


def test_slurm_all_unknown_falls_back_to_sacct_then_scontrol():
    s = system(SLURMSystem, {
        "squeue": err(data("slurm-squeue-unknown.stderr")),
        "sacct": err(data("slurm-sacct-disabled.stderr")),
        "scontrol show job 16": data("slurm-scontrol-failed.txt"),
        "scontrol show job 99": err("slurm_load_jobs error: Invalid job id specified"),
    })
    st = s.status(["16", "99"])
    assert st["16"].state is F and st["16"].exit_code == 3 and "99" not in st
    # accounting disabled: sacct is not asked again
    s.status(["16"])
    assert sum(c[0] == "sacct" for c in s.run_command.calls) == 1


def test_slurm_sacct_used_when_it_works():
    s = system(SLURMSystem, {"squeue": "", "sacct": "5|CANCELLED by 0|0:15\n6|COMPLETED|0:0\n"
                                                    "7|TIMEOUT|0:1\n"})
    st = s.status(["5", "6", "7"])
    assert (st["5"].state, st["6"].state, st["7"].state) == (C, D, F)
    assert not any(c[0] == "scontrol" for c in s.run_command.calls)


def test_status_timeout_and_other_errors_propagate():
    s = system(SLURMSystem, {"squeue": BatchCommandTimeout("squeue did not finish", cmd=["squeue"])})
    with pytest.raises(BatchCommandTimeout):
        s.status(["1"])
    s = system(SLURMSystem, {"squeue": err("slurm_load_jobs error: Unable to contact slurm controller")})
    with pytest.raises(BatchCommandError, match="failed"):
        s.status(["1"])


@pytest.mark.parametrize("native,state", [
    ("PENDING", P), ("CONFIGURING", P), ("RUNNING", R), ("COMPLETING", R), ("COMPLETED", D),
    ("FAILED", F), ("TIMEOUT", F), ("NODE_FAIL", F), ("OUT_OF_MEMORY", F), ("CANCELLED", C),
    ("PREEMPTED", F), ("WEIRD", U),
])
def test_slurm_state_table(native, state):
    assert SLURMSystem(cores=1, memory="1GB").to_state(native, None) is state


# ---------------------------------------------------------------- SGE

def test_sge_qstat_xml_capture():
    a, b, c, d, e, g = data("sge-ids.txt").split()
    c, d = c.split(".")[0], d.split(".")[0]
    s = SGESystem(cores=1, memory="1GB")
    found = s.parse_status(data("sge-qstat.xml"))
    states = {k: s.to_state(*v) for k, v in found.items()}
    assert states == {a: R, f"{c}.1": R, f"{c}.2": R, f"{c}.3": R,
                      **{f"{d}.{i}": P for i in range(1, 5)}, e: P, g: F}
    assert found[g][0] == "Eqw" and found[e][0] == "hqw"
    assert b not in found  # finished jobs vanish from qstat
    assert s.parse_status(data("sge-qstat-empty.xml")) == {}


@pytest.mark.parametrize("native,state", [
    ("qw", P), ("hqw", P), ("r", R), ("t", R), ("Rr", R), ("dr", C), ("Eqw", F), ("s", P),
    ("S", P), ("", U),
])
def test_sge_states(native, state):
    assert SGESystem(cores=1, memory="1GB").to_state(native, None) is state


def test_sge_missing_jobs_asked_from_qacct():
    a, b, *_ = data("sge-ids.txt").split()
    s = system(SGESystem, {"qstat -xml": data("sge-qstat-empty.xml"),
                           f"qacct -j {b}": data("sge-qacct-failed.txt"),
                           f"qacct -j {a}": data("sge-qacct-cancelled.txt"),
                           "qacct -j 7": err(data("sge-qacct-unknown.stderr")),
                           "qacct -j 8 -t 2": "failed 0\nexit_status 0\n"})
    st = s.status([a, b, "7", "8.2"])
    assert st[b].state is F and st[b].exit_code == 3
    assert st[a].state is F and st[a].exit_code == 137  # the cluster turns this into cancelled
    assert st["8.2"].state is D and "7" not in st
    assert parse_qacct("") is None


def test_sge_unparsable_xml_is_reported():
    s = system(SGESystem, {"qstat": "<job_info><oops"})
    with pytest.raises(BatchCommandError, match="unparsable XML"):
        s.status(["1"])


def test_sge_cancel_ignores_jobs_already_gone():
    s = system(SGESystem, {"qdel 3 4": err('denied: job "3" does not exist'),
                           "qdel 3": err('denied: job "3" does not exist'),
                           "qdel 4": "root has registered the job 4 for deletion\n"})
    s.cancel(["3", "4"])
    assert s.run_command.calls == [["qdel", "3", "4"], ["qdel", "3"], ["qdel", "4"]]


def test_cancel_reports_real_failures():
    s = system(SGESystem, {"qdel": err("error: commlib error: can't connect to service")})
    with pytest.raises(BatchCommandError):
        s.cancel(["3", "4"])


# ---------------------------------------------------------------- PBS

def test_pbs_json():
    s = system(PBSSystem, {"qstat": data("pbs-qstat.json")})
    ids = ["1234.pbs-head", "1235.pbs-head", "1236.pbs-head", "1237.pbs-head",
           "1238[0].pbs-head", "1238[1].pbs-head", "1239.pbs-head"]
    st = s.status(ids)
    assert [st[i].state for i in ids] == [R, P, F, D, R, F, P]
    assert st["1236.pbs-head"].exit_code == 3
    assert s.run_command.calls[0] == ["qstat", "-x", "-f", "-F", "json", "-t", "1234.pbs-head",
                                      "1235.pbs-head", "1236.pbs-head", "1237.pbs-head",
                                      "1238[].pbs-head", "1239.pbs-head"]


def test_pbs_table_and_unknown_ids():
    out = data("pbs-qstat-x.txt")
    s = system(PBSSystem, {"qstat": err("qstat: Unknown Job Id 9.pbs-head", 153, stdout=out)})
    st = s.status(["1234.pbs-head", "1235.pbs-head", "9.pbs-head"])
    assert (st["1234.pbs-head"].state, st["1235.pbs-head"].state) == (R, P)
    assert "9.pbs-head" not in st


# ---------------------------------------------------------------- LSF

def test_lsf_bjobs():
    s = system(LSFSystem, {"bjobs": data("lsf-bjobs.txt")})
    ids = ["1234", "1235", "1236", "1237", "1238[1]", "1238[2]", "1238[3]", "1239", "1240"]
    st = s.status(ids)
    assert [st[i].state for i in ids] == [R, P, F, D, R, P, F, P, U]
    assert st["1236"].exit_code == 3
    assert s.run_command.calls[0][:5] == ["bjobs", "-o", "jobid jobindex stat exit_code",
                                          "-noheader", "1234"]
    assert s.run_command.calls[0].count("1238") == 1


def test_lsf_unknown_ids_are_not_an_error():
    s = system(LSFSystem, {"bjobs": err("Job <77> is not found", 255, stdout="1234 - RUN -\n")})
    st = s.status(["1234", "77"])
    assert st["1234"].state is R and "77" not in st


def test_lsf_submits_on_stdin(tmp_path):
    s = system(LSFSystem, {"bsub": "Job <5> is submitted to queue <normal>.\n"})
    assert s.submit(str(tmp_path / "x.sh"), "#BSUB -J x\n") == "5"
    assert s.run_command.calls == [["bsub"]]
    s2 = LSFSystem(cores=1, memory="1GB", use_stdin=False)
    s2.run_command = FakeRunner({"bsub": "Job <6> is submitted to queue <normal>.\n"})
    assert s2.submit("/x.sh", "") == "6" and s2.run_command.calls == [["bsub", "/x.sh"]]


def test_submit_command_extra():
    s = SLURMSystem(cores=1, memory="1GB", submit_command_extra=["--qos=debug"])
    s.run_command = FakeRunner({"sbatch": "12\n"})
    assert s.submit("/j.sh", "") == "12"
    assert s.run_command.calls == [["sbatch", "--parsable", "--qos=debug", "/j.sh"]]


LSF_REPORT = """hpcsched worker: scheduler at tcp://10.0.0.1:1 refused our credentials: wrong secret?

------------------------------------------------------------
Sender: LSF System <lsfadmin@vm>
Subject: Job 1: <w-0> in cluster <c> Exited

Your job looked like:

------------------------------------------------------------
# LSBATCH: User input
#!/usr/bin/env bash
------------------------------------------------------------

Exited with exit code 1.

Resource usage summary:

    CPU time :                                   0.20 sec.
"""


def test_lsf_log_keeps_the_jobs_output_not_the_report():
    s = LSFSystem(cores=1, memory="1GB")
    out = s.job_output(LSF_REPORT)
    assert "refused our credentials" in out and "Exited with exit code 1." in out
    assert "Resource usage" not in out and "LSBATCH" not in out
    before = ("Sender: LSF System <lsfadmin@vm>\nSubject: Job 2\n\nThe output (if any) follows:\n\n"
              "Traceback: boom\n")
    assert s.job_output(before).strip() == "Traceback: boom"
    assert s.job_output("plain\n") == "plain\n"


def test_every_system_reads_a_done_job_with_a_non_zero_exit_as_failed():
    from hpcsched.jobqueue.job import JobState
    from hpcsched.jobqueue.systems import SYSTEMS, system_class

    for module in SYSTEMS:
        kw = {"disk": "1GB"} if module == "htcondor" else {}
        system = system_class(module)(cores=1, memory="1GB", **kw)
        done = [native for native, state in system.states.items() if state is JobState.DONE]
        for native in done:
            assert system.to_state(native, None) is JobState.DONE, module
            assert system.to_state(native, 0) is JobState.DONE, module
            if module != "sge":  # qacct's exit code is read apart (sge_state)
                assert system.to_state(native, 3) is JobState.FAILED, (module, native)
