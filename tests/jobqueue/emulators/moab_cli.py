"""``msub``, ``showq``, ``canceljob`` of the Moab emulator (over the PBS emulator).

Moab schedules for a resource manager, most often Torque: its jobs are PBS scripts,
which the PBS emulator's ``qsub`` reads (``pbs_submit``). Written from Adaptive
Computing's Moab Workload Manager documentation (``msub``, ``showq``, ``canceljob``):

* ``msub`` takes qsub's options and ``#PBS`` directives, prints an empty line and then
  the job's id (``<n>``), and adds ``MOAB_JOBID`` to the job's environment;
* ``showq --xml`` prints ``<Data><Object>queue</Object><cluster .../>`` and three
  ``<queue option="active|eligible|blocked" count="N">`` elements whose ``<job>``s carry
  ``JobID``, ``JobName``, ``State`` (Running; Idle; Hold), ``User``, ``ReqProcs``,
  ``SubmissionTime``, ``StartTime``; ``showq -c --xml`` one ``<queue option="completed">``
  whose jobs have ``State`` ``Completed`` or ``Removed`` (cancelled) and
  ``CompletionCode`` (the exit code; 128 + the signal; ``-1`` removed before running);
* ``canceljob ID ...`` prints ``job 'ID' cancelled``; an unknown or completed job:
  ``ERROR:  cannot locate job 'ID'``, exit 1.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import emucore
import pbs_submit
from emucore import EmulatorError


def msub(argv: list[str]) -> str:
    spawn = emucore.spawn_supervisor

    def moab_job(store: emucore.Store, key: str) -> None:
        # the record is stored and its supervisor not started yet: Moab's variable goes in
        rec = store.load(key)
        if rec is not None:
            run = {**rec["run"], "env": {**rec["run"]["env"], "MOAB_JOBID": str(rec["seq"])}}
            store.update(key, run=run, moab=True)
        spawn(store, key)

    emucore.spawn_supervisor = moab_job
    try:
        stdin = sys.stdin.read() if not [a for a in argv if not a.startswith("-")] else None
        printed = pbs_submit.qsub(argv, stdin)
    finally:
        emucore.spawn_supervisor = spawn
    if "[]" in printed:
        raise EmulatorError("ERROR:  this emulator does not submit job arrays", 1)
    return "\n" + printed.split(".", 1)[0]


def _moab_records(store: emucore.Store) -> list[dict]:
    return [r for r in store.records() if r.get("moab") and not r["array"]]


def _job(rec: dict, state: str, code: int | None = None) -> ET.Element:
    attrs = {
        "JobID": str(rec["seq"]),
        "JobName": str(rec.get("name", "")),
        "State": state,
        "User": emucore.username(),
        "ReqProcs": "1",
        "SubmissionTime": str(int(rec["submit_time"])),
    }
    if rec["start_time"]:
        attrs["StartTime"] = str(int(rec["start_time"]))
    if code is not None:
        attrs["CompletionCode"] = str(code)
    return ET.Element("job", attrs)


def showq(argv: list[str]) -> str:
    if "--xml" not in argv:
        raise EmulatorError("this emulator prints XML only (--xml)", 1)
    store = emucore.Store(emucore.state_dir("showq"))
    data = ET.Element("Data")
    ET.SubElement(data, "Object").text = "queue"
    ET.SubElement(
        data,
        "cluster",
        {
            "LocalActiveNodes": "1",
            "LocalIdleNodes": "0",
            "time": str(int(__import__("time").time())),
        },
    )
    recs = _moab_records(store)
    if "-c" in argv:
        done = ET.SubElement(data, "queue", {"option": "completed"})
        for rec in recs:
            if rec["state"] != emucore.FINISHED:
                continue
            if rec["term_reason"] == "delete":
                done.append(_job(rec, "Removed", -1 if rec["never_ran"] else 128 + 15))
            else:
                code = 128 + rec["signal"] if rec["signal"] else rec["exit_code"] or 0
                done.append(_job(rec, "Completed", code))
        done.set("count", str(len(done)))
    else:
        groups = {
            "active": (emucore.RUNNING, emucore.EXITING),
            "eligible": (emucore.QUEUED,),
            "blocked": (emucore.HELD,),
        }
        names = {
            emucore.RUNNING: "Running",
            emucore.EXITING: "Running",
            emucore.QUEUED: "Idle",
            emucore.HELD: "Hold",
        }
        for option, states in groups.items():
            queue = ET.SubElement(data, "queue", {"option": option})
            for rec in recs:
                if rec["state"] in states:
                    queue.append(_job(rec, names[rec["state"]]))
            queue.set("count", str(len(queue)))
    return ET.tostring(data, encoding="unicode")


def canceljob(argv: list[str]) -> str:
    if not argv:
        raise EmulatorError("ERROR:  no job specified", 1)
    store = emucore.Store(emucore.state_dir("canceljob"))
    lines, failed = [], []
    for job_id in argv:
        key = job_id.removeprefix("Moab.")
        rec = store.load(key)
        if rec is None or not rec.get("moab") or rec["state"] == emucore.FINISHED:
            failed.append(f"ERROR:  cannot locate job '{job_id}'")
            continue
        emucore.request_kill(store, key)
        lines.append(f"job '{job_id}' cancelled")
    if failed:
        raise EmulatorError("\n".join(lines + failed), 1)
    return "\n".join(lines)
