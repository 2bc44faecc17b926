"""``qstat`` and ``qdel`` of the PBS Professional / OpenPBS emulator.

Formats, from OpenPBS ``src/cmds/qstat.c``, ``src/cmds/qdel.c``,
``src/lib/Libcmds/prt_job_err.c``, ``doc/man1/qstat.1B`` and the PP-483 design page
(``qstat -f -F json``):

* default: ``Job id            Name             User              Time Use S Queue`` then
  ``----------------  ---------------- ----------------  -------- - -----`` and rows
  ``%-17s %-16s %-16s  %8s %1s %-16s`` (job id cut after the first server-name component,
  names of 16+ characters cut to 15). Finished jobs only with ``-x``; subjobs only with
  ``-t``. States: Q queued, H held, R running, E exiting, F finished, B array with a
  started subjob, X finished subjob of an unfinished array.
* ``-f``: ``Job Id: <id>`` then ``    name = value`` lines (long values wrapped at column 78
  after commas, continuation lines start with a tab), a blank line after each job.
* ``-f -F json``: ``{"timestamp":..,"pbs_version":..,"pbs_server":..,"Jobs":{id:{..}}}``
  with numbers as JSON numbers, ``Resource_List``/``resources_used``/``Variable_List`` as
  objects and times as ctime strings; ``Jobs`` is absent when no job is shown.
* errors on stderr: ``qstat: Unknown Job Id <id>`` (exit 153 = 15001 % 256),
  ``qstat: <id> Job has finished, use -x or -H to obtain historical job information``
  (exit 35 = 15139 % 256), ``qstat: illegally formed job identifier: <id>`` (exit 1).
* ``qdel id...``: silent on success; ``qdel: Unknown Job Id <id>`` (153),
  ``qdel: Job has finished <id>`` (35). Running jobs get SIGTERM, then SIGKILL after the
  grace period; ``Exit_status`` is 256+signal (271 for SIGTERM), a walltime kill gives
  -29 (JOB_EXEC_KILL_WALLTIME); a job deleted before it ran has no ``Exit_status``.
"""

from __future__ import annotations

import getopt
import json
import re
import sys
import time

import emucore
from emucore import EXITING, FINISHED, HELD, QUEUED, RUNNING, EmulatorError
from pbs_submit import PBS_VERSION, hms, queues, server_name

PBSE_UNKJOBID = 15001
PBSE_UNKQUE = 15018
PBSE_HISTJOBID = 15139
JOB_EXEC_KILL_WALLTIME = -29
JOBID_RE = re.compile(r"^(\d+)(\[(\d*)\])?(?:\.(.+))?$")


def ctime(epoch: float | None) -> str:
    return time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(epoch or 0))


def exit_status(rec: dict) -> int | None:
    if rec["state"] != FINISHED or rec["never_ran"]:
        return None
    if rec["term_reason"] == "walltime":
        return JOB_EXEC_KILL_WALLTIME
    if rec["signal"]:
        return 256 + rec["signal"]
    return rec["exit_code"]


def subjobs(store: emucore.Store, parent: dict) -> list[dict]:
    return [r for r in (store.load(f"{parent['seq']}_{i}") for i in parent["indices"]) if r]


def letter(rec: dict, store: emucore.Store) -> str:
    if rec["array"]:
        subs = subjobs(store, rec)
        if all(s["state"] == FINISHED for s in subs):
            return "F"
        if any(s["state"] in (RUNNING, EXITING, FINISHED) for s in subs):
            return "B"
        return "H" if all(s["state"] == HELD for s in subs) else "Q"
    state = rec["state"]
    if state == FINISHED and rec["index"] is not None:
        parent = store.load(str(rec["seq"]))
        return "F" if parent and letter(parent, store) == "F" else "X"
    return {QUEUED: "Q", HELD: "H", RUNNING: "R", EXITING: "E", FINISHED: "F"}[state]


def display_id(rec: dict) -> str:
    server = server_name()
    if rec["array"]:
        return f"{rec['seq']}[].{server}"
    if rec["index"] is not None:
        return f"{rec['seq']}[{rec['index']}].{server}"
    return f"{rec['seq']}.{server}"


def attributes(rec: dict, store: emucore.Store) -> dict:
    """The job's attributes in ``qstat -f`` order; nested dicts for resource lists."""
    pbs = rec["pbs"]
    host = emucore.hostname()
    state = letter(rec, store)
    started = rec["start_time"] is not None and not rec["array"]
    now = time.time()
    a: dict = {"Job_Name": pbs["Job_Name"], "Job_Owner": pbs["Job_Owner"]}
    ncpus = pbs["Resource_List"]["ncpus"]
    if started:
        end = rec["end_time"] or now
        a["resources_used"] = {
            "cpupercent": 0, "cput": hms(rec["cput"]), "mem": "0kb", "ncpus": ncpus,
            "vmem": "0kb", "walltime": hms(end - rec["start_time"]),
        }
    a["job_state"] = state
    a["queue"] = pbs["queue"]
    a["server"] = server_name()
    if pbs.get("Account_Name"):
        a["Account_Name"] = pbs["Account_Name"]
    a["Checkpoint"] = pbs["Checkpoint"]
    a["ctime"] = ctime(rec["submit_time"])
    if not rec["array"]:
        a["Error_Path"] = f"{host}:{rec['error_path']}"
    if started:
        a["exec_host"] = f"{host}/0*{ncpus}" if ncpus > 1 else f"{host}/0"
        a["exec_vnode"] = f"({host}:ncpus={ncpus})"
    a["Hold_Types"] = pbs["Hold_Types"]
    a["Join_Path"] = pbs["Join_Path"]
    a["Keep_Files"] = pbs["Keep_Files"]
    a["Mail_Points"] = pbs["Mail_Points"]
    a["mtime"] = ctime(rec["end_time"] or rec["start_time"] or rec["submit_time"])
    if not rec["array"]:
        a["Output_Path"] = f"{host}:{rec['output_path']}"
    a["Priority"] = pbs["Priority"]
    a["qtime"] = ctime(rec["submit_time"])
    a["Rerunable"] = pbs["Rerunable"]
    a["Resource_List"] = pbs["Resource_List"]
    if started:
        a["stime"] = ctime(rec["start_time"])
        a["session_id"] = rec["pid"] or 0
        a["jobdir"] = rec["run"]["cwd"]
    if state == "F" and rec["end_time"]:
        a["obittime"] = ctime(rec["end_time"])
    a["substate"] = substate(rec, state)
    a["Variable_List"] = pbs["Variable_List"]
    if started:
        when = ctime(rec["start_time"])
        a["comment"] = (f"Job run at {when} on ({host}:ncpus={ncpus})"
                        + (" and finished" if state in ("F", "X") else ""))
    a["etime"] = ctime(rec["submit_time"])
    if started:
        a["run_count"] = 1
    status = exit_status(rec) if not rec["array"] else None
    if status is not None:
        a["Exit_status"] = status
    a["Submit_arguments"] = pbs["Submit_arguments"]
    if state == "F" and rec["end_time"]:
        a["history_timestamp"] = int(rec["end_time"])
    a["project"] = pbs["project"]
    a["Submit_Host"] = pbs["Submit_Host"]
    if rec["array"]:
        subs = subjobs(store, rec)
        count = {k: 0 for k in ("Queued", "Running", "Exiting", "Expired")}
        for s in subs:
            key = {QUEUED: "Queued", HELD: "Queued", RUNNING: "Running",
                   EXITING: "Exiting", FINISHED: "Expired"}[s["state"]]
            count[key] += 1
        remaining = [str(s["index"]) for s in subs if s["state"] in (QUEUED, HELD)]
        a["array"] = "True"
        a["array_state_count"] = " ".join(f"{k}:{v}" for k, v in count.items())
        a["array_indices_submitted"] = rec["array_spec"]
        a["array_indices_remaining"] = ",".join(remaining) if remaining else "-"
    elif rec["index"] is not None:
        a["array_id"] = f"{rec['seq']}[].{server_name()}"
        a["array_index"] = rec["index"]
    return a


def substate(rec: dict, state: str) -> int:
    if state in ("F", "X"):
        return {"walltime": 93, "delete": 91}.get(rec["term_reason"] or "", 92)
    return {"Q": 10, "H": 20, "R": 42, "E": 50, "B": 40}[state]


def prt_attr(name: str, value: str) -> str:
    """``name = value`` broken after commas at column 78, as qstat's ``prt_attr``."""
    out = f"    {name} = "
    start = len(name) + 7
    first = True
    pieces = value.split(",") if value else [""]
    for i, piece in enumerate(pieces):
        if len(piece) + start < 78:
            out += piece
            start += len(piece)
        else:
            if not first:
                out += "\n\t"
                start = 9
            for ch in piece:
                out += ch
                start += 1
                if start > 78:
                    start = 8
                    out += "\n\t"
        if i + 1 < len(pieces):
            first = False
            out += ","
    return out


def full_text(jid: str, attrs: dict) -> str:
    lines = [f"Job Id: {jid}"]
    for name, value in attrs.items():
        if isinstance(value, dict) and name == "Variable_List":
            lines.append(prt_attr(name, ",".join(f"{k}={v}" for k, v in value.items())))
        elif isinstance(value, dict):
            lines += [prt_attr(f"{name}.{k}", str(v)) for k, v in value.items()]
        else:
            lines.append(prt_attr(name, str(value)))
    return "\n".join(lines) + "\n"


def table_row(rec: dict, store: emucore.Store) -> str:
    jid = display_id(rec)
    seq_part, _, server = jid.partition(".")
    jid = f"{seq_part}.{server.split('.')[0]}"[:17]
    name = rec["pbs"]["Job_Name"]
    name = name[:15] if len(name) >= 16 else name
    owner = rec["pbs"]["Job_Owner"].split("@")[0][:16]
    timeu = hms(rec["cput"]) if rec["start_time"] and not rec["array"] else "0"
    return f"{jid:<17} {name:<16} {owner:<16}  {timeu:>8} {letter(rec, store):>1} {rec['queue']:<16}"


HEADER = ("Job id            Name             User              Time Use S Queue\n"
          "----------------  ---------------- ----------------  -------- - -----")


class Lookup:
    """Resolve job-id operands to records; collect errors the way qstat/qdel print them."""

    def __init__(self, store: emucore.Store, command: str) -> None:
        self.store = store
        self.command = command
        self.failed = 0
        self.errors: list[str] = []

    def fail(self, message: str, code: int) -> None:
        self.errors.append(f"{self.command}: {message}")
        self.failed = code

    def find(self, operand: str) -> tuple[str, dict | None]:
        m = JOBID_RE.match(operand)
        if not m:
            self.fail(f"illegally formed job identifier: {operand}", 1)
            return operand, None
        seq, bracket, index, server = m.group(1), m.group(2), m.group(3), m.group(4)
        normal = f"{seq}{bracket or ''}.{server or server_name()}"
        if server and server.split(".")[0] != server_name().split(".")[0]:
            self.fail(f"Unknown Job Id {normal}", PBSE_UNKJOBID)
            return normal, None
        key = seq if not index else f"{seq}_{index}"
        rec = self.store.load(key)
        is_array = rec is not None and rec["array"]
        if rec is None or (bracket == "[]") != is_array or (bracket and not index and not is_array):
            self.fail(f"Unknown Job Id {normal}", PBSE_UNKJOBID)
            return normal, None
        return normal, rec


def parse(argv: list[str], optstring: str, usage: str) -> tuple[dict, list[str]]:
    try:
        opts, rest = getopt.gnu_getopt(argv, optstring)
    except getopt.GetoptError:
        raise EmulatorError(usage, 2) from None
    return dict(opts), rest


QSTAT_USAGE = """usage:
qstat [-f] [-J] [-p] [-t] [-x] [-E] [-F format] [-D delim] [ job_identifier... | destination... ]
qstat --version"""


def qstat(argv: list[str]) -> tuple[str, int, list[str]]:
    if argv == ["--version"]:
        return f"pbs_version = {PBS_VERSION}", 0, []
    opts, operands = parse(argv, "fF:D:xtJEwH", QSTAT_USAGE)
    fmt = opts.get("-F")
    if fmt is not None and (fmt != "json" or "-f" not in opts):
        raise EmulatorError(QSTAT_USAGE if fmt == "json" else
                            f"qstat: format {fmt} is not supported by the emulator", 2)
    if "-w" in opts:
        raise EmulatorError("qstat: -w is not supported by the emulator", 2)
    store = emucore.Store(emucore.state_dir("qstat"))
    history = "-x" in opts or "-H" in opts
    look = Lookup(store, "qstat")
    shown: list[dict] = []

    def visible(rec: dict) -> bool:
        finished = letter(rec, store) in ("F",)
        if "-H" in opts:
            return finished
        return history or not finished

    def with_subjobs(rec: dict) -> list[dict]:
        out = [rec]
        if rec["array"] and "-t" in opts:
            out += [s for s in subjobs(store, rec) if visible(s)]
        return out

    if not operands:
        for rec in store.records():
            if rec["index"] is None and visible(rec) and ("-J" not in opts or rec["array"]):
                shown += with_subjobs(rec)
    for operand in operands:
        if not operand[:1].isdigit():
            queue = operand.split("@")[0]
            if queue and queue not in queues():
                look.fail(f"Unknown queue destination {operand}", PBSE_UNKQUE)
                continue
            shown += [r for rec in store.records()
                      if rec["index"] is None and visible(rec) and (not queue or rec["queue"] == queue)
                      for r in with_subjobs(rec)]
            continue
        normal, rec = look.find(operand)
        if rec is None:
            continue
        if not history and letter(rec, store) == "F":
            look.errors.append(
                f"qstat: {normal} Job has finished, use -x or -H to obtain historical job information")
            look.failed = PBSE_HISTJOBID
            continue
        shown += with_subjobs(rec)
    if fmt == "json":
        doc: dict = {"timestamp": int(time.time()), "pbs_version": PBS_VERSION,
                     "pbs_server": server_name()}
        if shown:
            doc["Jobs"] = {display_id(r): attributes(r, store) for r in shown}
        text = json.dumps(doc, indent=4, separators=(",", ":"))
    elif "-f" in opts:
        text = "\n".join(full_text(display_id(r), attributes(r, store)) for r in shown)
    else:
        text = "\n".join([HEADER] + [table_row(r, store) for r in shown]) if shown else ""
    return text, look.failed % 256, look.errors


QDEL_USAGE = """usage:
\tqdel [-W force|suppress_email=X] [-x] job_identifier...
\tqdel --version"""


def qdel(argv: list[str]) -> tuple[int, list[str]]:
    opts, operands = parse(argv, "W:x", QDEL_USAGE)
    if not operands:
        raise EmulatorError(QDEL_USAGE, 2)
    store = emucore.Store(emucore.state_dir("qdel"))
    look = Lookup(store, "qdel")
    for operand in operands:
        normal, rec = look.find(operand)
        if rec is None:
            continue
        targets = subjobs(store, rec) if rec["array"] else [rec]
        if letter(rec, store) == "F":
            if "-x" in opts:
                for r in [rec] + targets:
                    (store.jobs / f"{r['key']}.json").unlink(missing_ok=True)
                continue
            look.fail(f"Job has finished {normal}", PBSE_HISTJOBID)
            continue
        for target in targets:
            if target["state"] != FINISHED:
                emucore.request_kill(store, target["key"])
    return look.failed % 256, look.errors


def run(func) -> None:
    try:
        result = func(sys.argv[1:])
    except EmulatorError as exc:
        print(exc.message, file=sys.stderr)
        sys.exit(exc.code)
    if func is qstat:
        text, code, errors = result
        if text:
            print(text)
    else:
        code, errors = result
    for line in errors:
        print(line, file=sys.stderr)
    sys.stdout.flush()
    sys.exit(code)
