"""The PBS and LSF emulators behave like the documented commands, with jobs that really run.

Each test drives the emulator binaries as a user (or an adapter) would: through
subprocesses with the emulator's ``bin`` first on ``PATH``. Job scripts wait for a ``go``
file instead of sleeping, so a test can observe the running state and then let the job
end. Fixtures kill whatever is left and check that no process survives.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until as wait_for
from tests.jobqueue.emulators import cleanup, emulator_env, live_processes, release

pytestmark = pytest.mark.timeout(60)

WAIT_GO = """
for i in $(seq 200); do [ -e "{go}" ] && break; sleep 0.05; done
"""




class Emu:
    """One emulated batch system with its own state directory."""

    def __init__(self, system: str, tmp_path: Path) -> None:
        self.state = tmp_path / f"{system}-state"
        self.env = emulator_env(system, self.state)
        self.cwd = tmp_path / "work"
        self.cwd.mkdir()
        self.go = self.cwd / "go"

    def run(self, *args: str, stdin: str | None = None, **extra: str) -> subprocess.CompletedProcess:
        env = dict(self.env, **extra)
        return subprocess.run(list(args), input=stdin, env=env, cwd=self.cwd, text=True,
                              capture_output=True, timeout=20)

    def script(self, name: str, body: str) -> Path:
        path = self.cwd / name
        path.write_text(body.replace("{go}", str(self.go)))
        return path


@pytest.fixture
def pbs(tmp_path):
    emu = Emu("pbs", tmp_path)
    yield emu
    cleanup(emu.state)
    assert live_processes(emu.state) == []


@pytest.fixture
def lsf(tmp_path):
    emu = Emu("lsf", tmp_path)
    yield emu
    cleanup(emu.state)
    assert live_processes(emu.state) == []


# ---------------------------------------------------------------------------------------
# PBS


def pbs_json(emu: Emu, *ids: str, history: bool = True) -> dict:
    args = ["qstat", "-f", "-F", "json"] + (["-x"] if history else []) + list(ids)
    res = emu.run(*args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout).get("Jobs", {})


def pbs_state(emu: Emu, jobid: str) -> str:
    return pbs_json(emu, jobid)[jobid]["job_state"]


def test_pbs_job_runs_with_pbs_environment_and_default_output_files(pbs):
    script = pbs.script("envjob.sh", "#!/bin/bash\n#PBS -N envjob\n"
                        "#PBS -l select=1:ncpus=2:mem=1gb\n#PBS -l walltime=00:05:00\n"
                        + WAIT_GO + "env | sort\necho nodefile=$(cat $PBS_NODEFILE)\n"
                        "echo pwd=$(pwd)\necho oops >&2\nexit 3\n")
    res = pbs.run("qsub", str(script))
    assert res.returncode == 0, res.stderr
    jobid = res.stdout.strip()
    assert re.fullmatch(r"\d+\.emu-pbs", jobid)
    wait_for(lambda: pbs_state(pbs, jobid) == "R", what="R")

    table = pbs.run("qstat").stdout.splitlines()
    assert table[0].split() == ["Job", "id", "Name", "User", "Time", "Use", "S", "Queue"]
    row = table[2].split()
    assert row[0] == jobid and row[1] == "envjob" and row[4] == "R" and row[5] == "workq"
    full = pbs.run("qstat", "-f", jobid).stdout
    assert full.startswith(f"Job Id: {jobid}\n") and "    job_state = R\n" in full
    assert "    Resource_List.ncpus = 2\n" in full and "    Resource_List.mem = 1gb\n" in full

    pbs.go.touch()
    wait_for(lambda: pbs_state(pbs, jobid) == "F", what="F")
    attrs = pbs_json(pbs, jobid)[jobid]
    assert attrs["Exit_status"] == 3 and attrs["Resource_List"]["walltime"] == "00:05:00"
    assert attrs["Variable_List"]["PBS_O_WORKDIR"] == str(pbs.cwd)

    seq = jobid.split(".")[0]
    out = (pbs.cwd / f"envjob.o{seq}").read_text()
    assert f"PBS_JOBID={jobid}\n" in out and "PBS_JOBNAME=envjob\n" in out
    assert f"PBS_O_WORKDIR={pbs.cwd}\n" in out and "NCPUS=2\n" in out
    assert "PBS_ENVIRONMENT=PBS_BATCH\n" in out and "nodefile=" in out
    assert f"pwd={Path.home()}\n" in out  # PBS starts jobs in $HOME
    assert (pbs.cwd / f"envjob.e{seq}").read_text() == "oops\n"

    gone = pbs.run("qstat", jobid)
    assert gone.returncode == 35
    assert gone.stderr.strip() == (f"qstat: {jobid} Job has finished, use -x or -H to obtain "
                                   "historical job information")
    assert pbs.run("qstat").stdout == ""  # finished jobs only with -x
    wait_for(lambda: live_processes(pbs.state) == [], what="supervisor exit")


def test_pbs_command_line_overrides_directives_and_arrays_run_every_index(pbs):
    script = pbs.script("arr.sh", "#!/bin/sh\n#PBS -N fromdirective\n#PBS -j oe\n"
                        "#PBS -o ignored.out\necho idx=$PBS_ARRAY_INDEX id=$PBS_JOBID\n")
    res = pbs.run("qsub", "-N", "fromcli", "-J", "0-2", "-o", "sub.^array_index^.out", str(script))
    assert res.returncode == 0, res.stderr
    arrayid = res.stdout.strip()
    seq = re.fullmatch(r"(\d+)\[\]\.emu-pbs", arrayid).group(1)
    wait_for(lambda: pbs_state(pbs, arrayid) == "F", what="array finished")
    jobs = pbs_json(pbs, "-t", arrayid)
    assert jobs[arrayid]["array_indices_submitted"] == "0-2"
    for i in range(3):
        sub = f"{seq}[{i}].emu-pbs"
        assert jobs[sub]["Job_Name"] == "fromcli" and jobs[sub]["Exit_status"] == 0
        assert (pbs.cwd / f"sub.{i}.out").read_text() == f"idx={i} id={sub}\n"
    assert not (pbs.cwd / "ignored.out").exists()


def test_pbs_stdin_submission_is_named_STDIN(pbs):
    res = pbs.run("qsub", "-l", "walltime=00:00:30", stdin="#!/bin/sh\necho from stdin\n")
    jobid = res.stdout.strip()
    wait_for(lambda: pbs_state(pbs, jobid) == "F", what="F")
    assert (pbs.cwd / f"STDIN.o{jobid.split('.')[0]}").read_text() == "from stdin\n"


def test_pbs_walltime_expiry_kills_the_job(pbs):
    script = pbs.script("long.sh", "#!/bin/sh\n#PBS -l walltime=00:00:01\nsleep 30\n")
    jobid = pbs.run("qsub", str(script)).stdout.strip()
    wait_for(lambda: pbs_state(pbs, jobid) == "F", timeout=8, what="walltime kill")
    attrs = pbs_json(pbs, jobid)[jobid]
    assert attrs["Exit_status"] == -29  # JOB_EXEC_KILL_WALLTIME
    err = (pbs.cwd / f"long.sh.e{jobid.split('.')[0]}").read_text()
    assert "=>> PBS: job killed: walltime" in err and "exceeded limit 1" in err


def test_pbs_qdel_terminates_a_running_job(pbs):
    script = pbs.script("sleepy.sh", "#!/bin/sh\nsleep 30\n")
    jobid = pbs.run("qsub", str(script)).stdout.strip()
    wait_for(lambda: pbs_state(pbs, jobid) == "R", what="R")
    res = pbs.run("qdel", jobid)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")
    wait_for(lambda: pbs_state(pbs, jobid) == "F", what="F after qdel")
    assert pbs_json(pbs, jobid)[jobid]["Exit_status"] == 271  # 256 + SIGTERM
    again = pbs.run("qdel", jobid)
    assert (again.returncode, again.stderr.strip()) == (35, f"qdel: Job has finished {jobid}")


def test_pbs_unknown_ids_and_refused_submissions(pbs):
    res = pbs.run("qstat", "999")
    assert (res.returncode, res.stderr.strip()) == (153, "qstat: Unknown Job Id 999.emu-pbs")
    res = pbs.run("qstat", "-f", "-F", "json", "999.emu-pbs")
    assert res.returncode == 153 and "Jobs" not in json.loads(res.stdout)
    res = pbs.run("qdel", "999.emu-pbs")
    assert (res.returncode, res.stderr.strip()) == (153, "qdel: Unknown Job Id 999.emu-pbs")
    script = pbs.script("ok.sh", "#!/bin/sh\ntrue\n")
    refused = {
        ("-q", "nosuch"): (170, "qsub: Unknown queue"),
        ("-l", "walltime=abc"): (166, "qsub: Illegal attribute or resource value Resource_List.walltime"),
        ("-l", "select=1:ncpus=x"): (166, "qsub: Illegal attribute or resource value Resource_List.select"),
        ("-l", "gpus_please=1"): (187, "qsub: Unknown resource Resource_List.gpus_please"),
    }
    for args, (code, message) in refused.items():
        res = pbs.run("qsub", *args, str(script))
        assert (res.returncode, res.stderr.strip(), res.stdout) == (code, message, ""), args
    res = pbs.run("qsub", "-l", "walltime", str(script))
    assert res.returncode == 2 and res.stderr.startswith("qsub: illegal -l value\nusage: qsub")
    assert pbs.run("qstat", "-x").stdout == ""  # nothing was created


def test_pbs_hold_and_max_running_keep_jobs_queued(pbs):
    script = pbs.script("w.sh", "#!/bin/sh\n" + WAIT_GO)
    held = pbs.run("qsub", str(script), HPCSCHED_EMU_HOLD="1").stdout.strip()
    time.sleep(0.4)  # several supervisor polls: the job must not start
    assert pbs_state(pbs, held) == "Q"
    release(pbs.state)
    wait_for(lambda: pbs_state(pbs, held) == "R", what="release")
    second = pbs.run("qsub", str(script), HPCSCHED_EMU_MAX_RUNNING="1").stdout.strip()
    time.sleep(0.4)
    assert pbs_state(pbs, second) == "Q"
    pbs.go.touch()
    wait_for(lambda: pbs_state(pbs, second) == "F", what="second job ran after the first")


# ---------------------------------------------------------------------------------------
# LSF


def lsf_stat(emu: Emu, jobid: str, fields: str = "stat") -> str:
    res = emu.run("bjobs", "-noheader", "-o", fields, jobid)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_lsf_job_runs_with_lsf_environment_and_report(lsf):
    script = lsf.script("job.sh", "#!/bin/bash\n#BSUB -J envjob\n#BSUB -n 2\n"
                        "#BSUB -o out.%J\n#BSUB -W 5\n" + WAIT_GO + "env | sort\necho pwd=$(pwd)\n")
    res = lsf.run("bsub", stdin=script.read_text())
    assert res.returncode == 0, res.stderr
    seq = re.fullmatch(r"Job <(\d+)> is submitted to default queue <normal>\.\n", res.stdout).group(1)
    wait_for(lambda: lsf_stat(lsf, seq) == "RUN", what="RUN")
    table = lsf.run("bjobs").stdout.splitlines()
    assert table[0] == "JOBID   USER    STAT  QUEUE      FROM_HOST   EXEC_HOST   JOB_NAME   SUBMIT_TIME"
    assert table[1].split()[:3] == [seq, table[1].split()[1], "RUN"] and "envjob" in table[1]
    lsf.go.touch()
    wait_for(lambda: lsf_stat(lsf, seq) == "DONE", what="DONE")
    out = (lsf.cwd / f"out.{seq}").read_text()
    assert f"LSB_JOBID={seq}\n" in out and "LSB_JOBNAME=envjob\n" in out
    assert "LSB_DJOB_NUMPROC=2\n" in out and re.search(r"LSB_MCPU_HOSTS=\S+ 2\n", out)
    assert "LSB_JOBINDEX=0\n" in out and f"pwd={lsf.cwd}\n" in out  # LSF keeps the cwd
    assert "Successfully completed." in out
    assert lsf.run("bjobs").stderr.strip() == "No unfinished job found"
    wait_for(lambda: live_processes(lsf.state) == [], what="supervisor exit")


def test_lsf_array_and_command_submission(lsf):
    res = lsf.run("bsub", "-q", "normal", "-J", "arr[1-3]", "-o", "o.%J.%I",
                  "echo idx=$LSB_JOBINDEX")
    seq = re.fullmatch(r"Job <(\d+)> is submitted to queue <normal>\.\n", res.stdout).group(1)
    wait_for(lambda: lsf_stat(lsf, seq).split() == ["DONE"] * 3, what="array DONE")
    names = lsf.run("bjobs", "-noheader", "-o", "jobid job_name", seq).stdout.splitlines()
    assert names == [f"{seq} arr[1]", f"{seq} arr[2]", f"{seq} arr[3]"]
    for i in (1, 2, 3):
        assert (lsf.cwd / f"o.{seq}.{i}").read_text().startswith(f"idx={i}\n")
    assert lsf_stat(lsf, f"{seq}[2]", "jobindex stat") == "2 DONE"
    # "bsub script" runs the file as a command: its #BSUB lines are not read
    script = lsf.script("cmd.sh", "#!/bin/sh\n#BSUB -J ignored\ntrue\n")
    seq2 = re.search(r"<(\d+)>", lsf.run("bsub", str(script)).stdout).group(1)
    assert lsf_stat(lsf, seq2, "job_name") == str(script)


def test_lsf_run_limit_kills_the_job(lsf):
    res = lsf.run("bsub", "-W", "1", "-o", "rl.out", "sleep 30", HPCSCHED_EMU_TIME_SCALE=str(1 / 60))
    seq = re.search(r"<(\d+)>", res.stdout).group(1)
    wait_for(lambda: lsf_stat(lsf, seq).startswith("EXIT"), timeout=8, what="run limit")
    assert lsf_stat(lsf, seq, "stat exit_code term_reason") == "EXIT 140 TERM_RUNLIMIT"
    assert "TERM_RUNLIMIT: job killed after reaching LSF run time limit." in (
        lsf.cwd / "rl.out").read_text()


def test_lsf_bkill_and_error_messages(lsf):
    seq = re.search(r"<(\d+)>", lsf.run("bsub", "-o", "k.out", "sleep 30").stdout).group(1)
    wait_for(lambda: lsf_stat(lsf, seq) == "RUN", what="RUN")
    res = lsf.run("bkill", seq)
    assert (res.returncode, res.stdout) == (0, f"Job <{seq}> is being terminated\n")
    wait_for(lambda: lsf_stat(lsf, seq).startswith("EXIT"), what="EXIT")
    assert lsf_stat(lsf, seq, "stat term_reason") == "EXIT TERM_OWNER"
    res = lsf.run("bkill", seq)
    assert (res.returncode, res.stderr.strip()) == (255, f"Job <{seq}>: Job has already finished")
    res = lsf.run("bkill", "99")
    assert (res.returncode, res.stderr.strip()) == (255, "Job <99>: No matching job found")
    res = lsf.run("bjobs", "99")
    assert (res.returncode, res.stdout, res.stderr.strip()) == (255, "", "Job <99> is not found")
    res = lsf.run("bsub", "-q", "nosuch", "true")
    assert (res.returncode, res.stderr.strip()) == (255, "nosuch: No such queue. Job not submitted.")
    doc = json.loads(lsf.run("bjobs", "-o", "jobid stat exit_code", "-json", seq, "99").stdout)
    assert doc["COMMAND"] == "bjobs" and doc["JOBS"] == 1
    assert doc["RECORDS"][0]["JOBID"] == seq and doc["RECORDS"][0]["STAT"] == "EXIT"
    assert doc["RECORDS"][1] == {"JOBID": "99", "ERROR": "Job <99> is not found"}


def test_lsf_hold_max_running_and_memory_units(lsf, tmp_path):
    envdir = tmp_path / "lsfconf"
    envdir.mkdir()
    (envdir / "lsf.conf").write_text("LSF_UNIT_FOR_LIMITS=MB\n")
    script = lsf.script("w.sh", "#!/bin/sh\n" + WAIT_GO)
    out = lsf.run("bsub", "-M", "2000", "-o", "h.out", stdin=script.read_text(),
                  HPCSCHED_EMU_HOLD="1", LSF_ENVDIR=str(envdir)).stdout
    held = re.search(r"<(\d+)>", out)
    assert held, out
    held = held.group(1)
    time.sleep(0.4)
    assert lsf_stat(lsf, held, "stat memlimit") == f"PEND {2000 * 1024} K"
    release(lsf.state)
    wait_for(lambda: lsf_stat(lsf, held) == "RUN", what="release")
    out = lsf.run("bsub", "-o", "h2.out", stdin=script.read_text(),
                  HPCSCHED_EMU_MAX_RUNNING="1").stdout
    second = re.search(r"<(\d+)>", out).group(1)
    time.sleep(0.4)
    assert lsf_stat(lsf, second) == "PEND"
    lsf.go.touch()
    wait_for(lambda: lsf_stat(lsf, second) == "DONE", what="second job ran after the first")
