"""``oarsub``, ``oarstat``, ``oardel`` of the OAR emulator.

Written from OAR 2.5's manual pages (``oarsub(1)``, ``oarstat(1)``, ``oardel(1)``) and
its user documentation:

* ``oarsub -S script`` reads the script's ``#OAR`` lines (options as on the command
  line, which win), runs the script itself (it must be executable) in the submission
  directory, and prints ``OAR_JOB_ID=<id>`` after its admission rules' notes. ``-l``
  takes ``/nodes=1/core=N,walltime=H:M:S`` (one line: several make a moldable job);
  ``-O``/``-E`` name the output files (``%jobid%`` replaced; default
  ``OAR.<id>.stdout``/``.stderr``). Queues: ``default`` (``HPCSCHED_EMU_QUEUES``).
* The job starts with a login environment plus ``OAR_JOB_ID``, ``OAR_JOBID``,
  ``OAR_JOB_NAME``, ``OAR_NODEFILE`` (this host once per core), ``OAR_WORKDIR``,
  ``OAR_JOB_WALLTIME_SECONDS``.
* ``oarstat -f -J -j ID ...`` prints a JSON object keyed by job id: ``state``
  (Waiting, Hold, Running, Finishing, Terminated, Error) and ``exit_code`` (the wait
  status, ``null`` until the end). A job deleted, or killed at its walltime, ends in
  ``Error``. Unknown ids are left out.
* ``oardel ID ...`` asks for the deletion; an unknown or finished job is an error
  (exit 1) that names it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import emucore
import emusys
from emucore import EmulatorError


def _options(argv: list[str]) -> dict[str, list[str]]:
    opts: dict[str, list[str]] = {}
    names = {
        "-n": "name",
        "--name": "name",
        "-q": "queue",
        "--queue": "queue",
        "--project": "project",
        "-l": "resource",
        "--resource": "resource",
        "-O": "stdout",
        "--stdout": "stdout",
        "-E": "stderr",
        "--stderr": "stderr",
        "-p": "property",
        "--property": "property",
        "-t": "type",
        "--type": "type",
        "-S": "scanscript",
        "--scanscript": "scanscript",
        "-d": "directory",
    }
    i = 0
    while i < len(argv):
        arg = argv[i]
        key, eq, value = arg.partition("=")
        if key in names and names[key] == "scanscript":
            opts.setdefault("scanscript", []).append("1")
        elif key in names and eq:
            opts.setdefault(names[key], []).append(value)
        elif arg in names:
            if i + 1 >= len(argv):
                raise EmulatorError(f"[ERROR] option {arg} needs a value", 1)
            opts.setdefault(names[arg], []).append(argv[i + 1])
            i += 1
        elif arg.startswith("-"):
            raise EmulatorError(f"Unknown option: {arg.lstrip('-')}", 1)
        else:
            opts.setdefault("command", []).append(arg)
        i += 1
    return opts


def _walltime(resources: list[str]) -> float | None:
    for spec in resources:
        m = re.search(r"walltime=(\d+)(?::(\d+))?(?::(\d+))?", spec)
        if m:
            h, mi, s = (int(x or 0) for x in m.groups())
            return h * 3600 + mi * 60 + s
    return None


def _cores(resources: list[str]) -> int:
    for spec in resources:
        m = re.search(r"core=(\d+)", spec)
        if m:
            return int(m.group(1))
    return 1


def oarsub(argv: list[str]) -> str:
    opts = _options(argv)
    if "scanscript" not in opts:
        raise EmulatorError("[ERROR] this emulator runs scripts given with -S only", 1)
    if len(opts.get("command", [])) != 1:
        raise EmulatorError("[ERROR] -S takes one script", 1)
    script = Path(opts["command"][0]).resolve()
    try:
        text = script.read_text()
    except OSError:
        raise EmulatorError(f"[ERROR] cannot read the script {script}", 6) from None
    if not os.access(script, os.X_OK):
        raise EmulatorError(f"[ERROR] the script {script} is not executable", 6)
    directives: list[str] = []
    for line in text.splitlines()[1:]:
        if line.startswith("#OAR "):
            directives += shlex.split(line[5:])
        elif line.strip() and not line.startswith("#"):
            break
    opts = {**_options(directives), **{k: v for k, v in opts.items() if k != "command"}}
    resources = opts.get("resource", [])
    if len(resources) > 1:
        raise EmulatorError("[ERROR] this emulator does not schedule moldable jobs", 6)
    queues = os.environ.get("HPCSCHED_EMU_QUEUES", "default").split(",")
    queue = opts.get("queue", [queues[0]])[-1]
    if queue not in queues:
        raise EmulatorError(f"# ADMISSION RULE] Error: queue {queue} does not exist", 6)
    walltime = _walltime(resources) or 7200.0
    cores = _cores(resources)
    cwd = os.getcwd()
    store = emucore.Store(emucore.state_dir("oarsub"))
    name = opts.get("name", [script.name])[-1]

    def paths(seq: int) -> tuple[str, str]:
        out = opts.get("stdout", ["OAR.%jobid%.stdout"])[-1].replace("%jobid%", str(seq))
        err = opts.get("stderr", ["OAR.%jobid%.stderr"])[-1].replace("%jobid%", str(seq))
        return (os.path.join(cwd, out), os.path.join(cwd, err))

    def job_env(seq: int, index: int | None) -> dict[str, str]:
        nodefile = store.root / "nodefiles" / str(seq)
        nodefile.parent.mkdir(exist_ok=True)
        nodefile.write_text(f"{emucore.hostname()}\n" * cores)
        return {
            "OAR_JOB_ID": str(seq),
            "OAR_JOBID": str(seq),
            "OAR_JOB_NAME": name,
            "OAR_NODEFILE": str(nodefile),
            "OAR_WORKDIR": cwd,
            "OAR_O_WORKDIR": cwd,
            "OAR_JOB_WALLTIME_SECONDS": str(int(walltime)),
        }

    def log(seq: int, index: int | None) -> tuple[str, str | None]:
        out, err = paths(seq)
        return out, (None if err == out else err)

    seq = emusys.submit(
        "oar",
        store,
        [str(script)],
        env=emusys.login_env(),
        log=log,
        cwd=cwd,
        walltime=walltime,
        job_env=job_env,
        fields=lambda s, i: {"name": name, "queue": queue, "cores": cores},
    )
    return f"[ADMISSION RULE] Set default walltime to 7200.\nOAR_JOB_ID={seq}"


def _state(rec: dict) -> tuple[str, int | None]:
    state = rec["state"]
    if state == emucore.QUEUED:
        return "Waiting", None
    if state == emucore.HELD:
        return "Hold", None
    if state == emucore.RUNNING:
        return "Running", None
    if state == emucore.EXITING:
        return "Finishing", None
    if rec["never_ran"] or rec["term_reason"] in ("delete", "walltime"):
        return "Error", None
    if rec["signal"]:
        return "Error", rec["signal"]
    return "Terminated", (rec["exit_code"] or 0) << 8


def oarstat(argv: list[str]) -> str:
    ids = [argv[i + 1] for i, a in enumerate(argv) if a in ("-j", "--job") and i + 1 < len(argv)]
    if "-J" not in argv and "--json" not in argv:
        raise EmulatorError("this emulator prints JSON only (-J)", 1)
    store = emucore.Store(emucore.state_dir("oarstat"))
    records = {r["key"]: r for r in store.records() if r["system"] == "oar"}
    out = {}
    for job_id in ids or list(records):
        rec = records.get(job_id)
        if rec is None:
            continue
        state, code = _state(rec)
        out[job_id] = {
            "Job_Id": int(job_id),
            "name": rec.get("name"),
            "state": state,
            "exit_code": code,
            "queue": rec.get("queue"),
            "owner": emucore.username(),
            "submissionTime": int(rec["submit_time"]),
            "startTime": int(rec["start_time"] or 0),
            "stopTime": int(rec["end_time"] or 0),
        }
    return json.dumps(out, indent=3)


def oardel(argv: list[str]) -> str:
    store = emucore.Store(emucore.state_dir("oardel"))
    lines, failed = [], False
    for job_id in argv:
        try:
            state = emucore.request_kill(store, job_id) if job_id.isdigit() else None
        except KeyError:
            state = None
        if state is None:
            lines.append(f"Deleting the job = {job_id} ...[ERROR] job {job_id} does not exist")
            failed = True
        elif state == emucore.FINISHED:
            lines.append(
                f"Deleting the job = {job_id} ...[ERROR] job {job_id} is not in a "
                "state to be deleted (already killed or terminated)"
            )
            failed = True
        else:
            lines.append(f"Deleting the job = {job_id} ...REGISTERED.")
    if failed:
        raise EmulatorError("\n".join(lines), 1)
    return "\n".join(lines)
