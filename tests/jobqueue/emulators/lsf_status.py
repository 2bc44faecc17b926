"""``bjobs`` and ``bkill`` of the IBM Spectrum LSF emulator, and LSF's job report.

Formats, from IBM Spectrum LSF 10.1 docs (bjobs -o, -json, LSB_BJOBS_CONSISTENT_EXIT_CODE)
and OpenLava ``lsbatch/cmd/bjobs.c`` / ``cmd.sig.c``:

* default table: ``JOBID   USER    STAT  QUEUE      FROM_HOST   EXEC_HOST   JOB_NAME   SUBMIT_TIME``
  rows ``%-7s %-7.7s %-5.5s %-10.10s %-11.11s %-11.11s %-10.10s %s``, job names longer than
  10 characters shown as ``*`` + their last 9, EXEC_HOST ``N*host`` for N slots, times
  ``%b %e %H:%M``; array elements show ``name[i]``. Without job ids only unfinished jobs
  (``-a`` adds finished ones); with job ids every state is shown.
* ``-o "field[:[-][width]] ... [delimiter='c']"``: a header of upper-case field names (not
  with ``-noheader``), unlimited-width fields separated by one space; empty values ``-``.
  Fields: jobid jobindex stat user queue job_name from_host exec_host submit_time
  start_time finish_time exit_code term_reason/exit_reason proj_name command slots
  memlimit runtimelimit (aliases id, name, proj, cmd).
* ``-o ... -json``: ``{"COMMAND":"bjobs","JOBS":n,"RECORDS":[{"JOBID":"12",...}]}`` with
  string values (empty string when there is none); a missing job gives a record
  ``{"JOBID":"99","ERROR":"Job <99> is not found"}``.
* errors on stderr: ``Job <99> is not found`` (exit 255), ``No unfinished job found``
  (exit 0, or 255 with LSB_BJOBS_CONSISTENT_EXIT_CODE=Y).
* states: PEND, PSUSP (held with ``bsub -H``), RUN, DONE (exit 0), EXIT (non-zero, signal,
  ``TERM_RUNLIMIT`` after ``-W``, ``TERM_OWNER`` after bkill); exit_code of a signalled
  job is 128+signal.
* ``bkill id...``: ``Job <12> is being terminated`` on stdout; ``Job <99>: No matching job
  found`` / ``Job <12>: Job has already finished`` on stderr, exit 255. Running jobs get
  SIGINT, SIGTERM, SIGKILL spaced by the grace period.
"""

from __future__ import annotations

import json
import re
import sys
import time

import emucore
from emucore import EXITING, FINISHED, HELD, QUEUED, RUNNING, EmulatorError
from lsf_submit import CLUSTER, setting

JOBID_RE = re.compile(r"^(\d+)(?:\[(\d+)\])?$")
FIELDS = {  # name: (header, recommended width)
    "jobid": ("JOBID", 7), "jobindex": ("JOBINDEX", 8), "stat": ("STAT", 5),
    "user": ("USER", 7), "queue": ("QUEUE", 10), "job_name": ("JOB_NAME", 10),
    "from_host": ("FROM_HOST", 11), "exec_host": ("EXEC_HOST", 11),
    "submit_time": ("SUBMIT_TIME", 15), "start_time": ("START_TIME", 15),
    "finish_time": ("FINISH_TIME", 16), "exit_code": ("EXIT_CODE", 10),
    "term_reason": ("TERM_REASON", 13), "exit_reason": ("EXIT_REASON", 50),
    "proj_name": ("PROJ_NAME", 11), "command": ("COMMAND", 15), "slots": ("SLOTS", 5),
    "memlimit": ("MEMLIMIT", 10), "runtimelimit": ("RUNTIMELIMIT", 12),
}
ALIASES = {"id": "jobid", "name": "job_name", "proj": "proj_name", "cmd": "command"}
TERM = {"walltime": "TERM_RUNLIMIT", "delete": "TERM_OWNER"}
TERM_TEXT = {"walltime": "TERM_RUNLIMIT: job killed after reaching LSF run time limit.",
             "delete": "TERM_OWNER: job killed by owner."}


def lsf_time(epoch: float | None) -> str:
    return time.strftime("%b %e %H:%M", time.localtime(epoch)) if epoch else ""


def stat_of(rec: dict) -> str:
    state = rec["state"]
    if state == FINISHED:
        ok = rec["exit_code"] == 0 and not rec["signal"] and not rec["term_reason"]
        return "DONE" if ok and not rec["never_ran"] else "EXIT"
    return {QUEUED: "PEND", HELD: "PSUSP", RUNNING: "RUN", EXITING: "RUN"}[state]


def exit_code(rec: dict) -> str:
    if rec["state"] != FINISHED or rec["never_ran"]:
        return ""
    code = 128 + rec["signal"] if rec["signal"] else rec["exit_code"]
    return "" if not code else str(code)


def values(rec: dict) -> dict[str, str]:
    lsf = rec["lsf"]
    started = rec["start_time"] is not None
    slots = lsf["slots"]
    exec_host = "" if not started else (f"{slots}*{emucore.hostname()}" if slots > 1
                                        else emucore.hostname())
    limit = rec["run"].get("walltime")
    return {
        "jobid": str(rec["seq"]), "jobindex": str(rec["index"] or 0), "stat": stat_of(rec),
        "user": lsf["user"], "queue": rec["queue"], "job_name": lsf["job_name"],
        "from_host": lsf["from_host"], "exec_host": exec_host,
        "submit_time": lsf_time(rec["submit_time"]), "start_time": lsf_time(rec["start_time"]),
        "finish_time": lsf_time(rec["end_time"]) if rec["state"] == FINISHED else "",
        "exit_code": exit_code(rec), "term_reason": TERM.get(rec["term_reason"] or "", ""),
        "exit_reason": TERM.get(rec["term_reason"] or "", ""), "proj_name": lsf["project"],
        "command": lsf["command"], "slots": str(slots),
        "memlimit": f"{lsf['memlimit_kb']} K" if lsf["memlimit_kb"] else "",
        "runtimelimit": f"{limit / 60:.1f}/{emucore.hostname()}" if limit else "",
    }


def truncate_name(name: str, width: int) -> str:
    return name if len(name) <= width else "*" + name[-(width - 1):]


def table_row(rec: dict) -> str:
    v = values(rec)
    return (f"{v['jobid']:<7} {v['user']:<7.7} {v['stat']:<5.5} {v['queue']:<10.10} "
            f"{v['from_host']:<11.11} {v['exec_host']:<11.11} "
            f"{truncate_name(v['job_name'], 10):<10.10} {v['submit_time']}")


TABLE_HEADER = "JOBID   USER    STAT  QUEUE      FROM_HOST   EXEC_HOST   JOB_NAME   SUBMIT_TIME"


def parse_format(spec: str) -> tuple[list[tuple[str, int | None, bool]], str]:
    delimiter = " "
    m = re.search(r"delimiter=(['\"])(.*?)\1", spec)
    if m:
        delimiter = m.group(2)
        spec = spec[:m.start()] + spec[m.end():]
    fields = []
    for token in spec.split():
        name, _, rest = token.partition(":")
        name = ALIASES.get(name.lower(), name.lower())
        if name not in FIELDS:
            raise EmulatorError(f"{token}: Illegal field name.", 255)
        width: int | None = None
        right = False
        if ":" in token:
            w = rest.split(":")[0]
            right = w.startswith("-")
            w = w.lstrip("-")
            width = int(w) if w.isdigit() else FIELDS[name][1]
        fields.append((name, width, right))
    if not fields:
        raise EmulatorError("bjobs: -o: output format is empty.", 255)
    return fields, delimiter


def cell(value: str, name: str, width: int | None, right: bool) -> str:
    value = value or "-"
    if width is None:
        return value
    if len(value) > width:
        value = truncate_name(value, width) if name == "job_name" else value[:width]
    return value.rjust(width) if right else value.ljust(width)


class Selection:
    """Records selected by job-id operands, with bjobs/bkill error handling."""

    def __init__(self, store: emucore.Store) -> None:
        self.store = store

    def expand(self, operand: str) -> list[dict] | None:
        m = JOBID_RE.match(operand)
        if not m:
            raise EmulatorError(f"{operand}: Illegal job ID.", 255)
        seq, index = m.group(1), m.group(2)
        rec = self.store.load(seq if index is None else f"{seq}_{index}")
        if rec is None:
            return None
        if rec["array"]:
            return [r for r in (self.store.load(f"{seq}_{i}") for i in rec["indices"]) if r]
        return [rec]

    def all_jobs(self) -> list[dict]:
        return [r for r in self.store.records() if not r["array"]]


def split_opts(argv: list[str], with_arg: set[str], flags: set[str]) -> tuple[dict, list[str]]:
    opts: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in with_arg:
            if i + 1 >= len(argv):
                raise EmulatorError(f"{word}: option requires an argument", 255)
            opts[word] = argv[i + 1]
            i += 1
        elif word in flags:
            opts[word] = ""
        elif word.startswith("-") and word != "0":
            raise EmulatorError(f"Illegal option {word}", 255)
        else:
            rest.append(word)
        i += 1
    return opts, rest


def bjobs(argv: list[str]) -> tuple[str, int, list[str]]:
    opts, ids = split_opts(argv, {"-o", "-u", "-q", "-J"},
                           {"-a", "-noheader", "-json", "-w", "-r", "-p", "-d", "-s", "-hms"})
    if "-l" in argv:
        raise EmulatorError("bjobs: -l is not supported by the emulator", 255)
    fmt = opts.get("-o") or setting("LSB_BJOBS_FORMAT", "")
    if "-json" in opts and ("-noheader" in opts or not fmt):
        raise EmulatorError("bjobs: -json needs -o and cannot be used with -noheader", 255)
    sel = Selection(emucore.Store(emucore.state_dir("bjobs")))
    errors: list[str] = []
    records: list[tuple[dict | None, str]] = []
    failed = False
    if ids:
        for operand in ids:
            found = sel.expand(operand)
            if found is None:
                errors.append(f"Job <{operand}> is not found")
                records.append((None, operand))
                failed = True
            else:
                records += [(r, operand) for r in found]
    else:
        for rec in sel.all_jobs():
            if rec["state"] != FINISHED or "-a" in opts or "-d" in opts:
                records.append((rec, ""))
    filters = {"-r": ("RUN",), "-p": ("PEND", "PSUSP"), "-d": ("DONE", "EXIT"), "-s": ("PSUSP",)}
    for flag, wanted in filters.items():
        if flag in opts:
            records = [(r, o) for r, o in records if r is None or stat_of(r) in wanted]
    if "-q" in opts:
        records = [(r, o) for r, o in records if r is None or r["queue"] == opts["-q"]]
    if "-J" in opts:
        records = [(r, o) for r, o in records if r is None or r["name"] == opts["-J"]]
    shown = [r for r, _ in records if r is not None]
    consistent = setting("LSB_BJOBS_CONSISTENT_EXIT_CODE", "N").upper() == "Y"
    if not ids and not shown:
        errors.append("No unfinished job found" if "-a" not in opts else "No job found")
        failed = consistent
    if fmt and "-json" in opts:
        fields, _ = parse_format(fmt)
        out = []
        for rec, operand in records:
            if rec is None:
                out.append({"JOBID": operand, "ERROR": f"Job <{operand}> is not found"})
            else:
                v = values(rec)
                out.append({FIELDS[n][0]: v[n] for n, _, _ in fields})
        doc = {"COMMAND": "bjobs", "JOBS": len(shown), "RECORDS": out}
        errors = [e for e in errors if not e.startswith("Job <")]
        return json.dumps(doc, indent=2, separators=(",", ":")), 255 if failed else 0, errors
    if fmt:
        fields, delimiter = parse_format(fmt)
        lines = []
        if "-noheader" not in opts and shown:
            lines.append(delimiter.join(cell(FIELDS[n][0], n, w, r) for n, w, r in fields))
        for rec in shown:
            v = values(rec)
            lines.append(delimiter.join(cell(v[n], n, w, r) for n, w, r in fields))
        return "\n".join(lines), 255 if failed else 0, errors
    lines = ([] if "-noheader" in opts or not shown else [TABLE_HEADER])
    lines += [table_row(r) for r in shown]
    return "\n".join(lines), 255 if failed else 0, errors


def bkill(argv: list[str]) -> tuple[str, int, list[str]]:
    opts, ids = split_opts(argv, {"-J", "-q", "-u", "-m"}, {"-r"})
    if "-s" in argv:
        raise EmulatorError("bkill: -s is not supported by the emulator", 255)
    store = emucore.Store(emucore.state_dir("bkill"))
    sel = Selection(store)
    if not ids and not ({"-J", "-q", "-u"} & opts.keys()):
        raise EmulatorError("Job ID or one of '-m', '-u' '-q' and '-J' must be specified.", 255)
    targets: list[tuple[str, list[dict] | None]] = []
    if ids == ["0"] or (not ids and opts):
        for rec in sel.all_jobs():
            if rec["state"] == FINISHED:
                continue
            if ("-q" in opts and rec["queue"] != opts["-q"]) or (
                    "-J" in opts and rec["name"] != opts["-J"]):
                continue
            label = str(rec["seq"]) if rec["index"] is None else f"{rec['seq']}[{rec['index']}]"
            targets.append((label, [rec]))
        if not targets:
            return "", 255, ["No unfinished job found"]
    else:
        targets = [(operand, sel.expand(operand)) for operand in ids]
    lines: list[str] = []
    errors: list[str] = []
    for label, recs in targets:
        if recs is None:
            errors.append(f"Job <{label}>: No matching job found")
            continue
        live = [r for r in recs if r["state"] != FINISHED]
        if not live:
            errors.append(f"Job <{label}>: Job has already finished")
            continue
        for rec in live:
            emucore.request_kill(store, rec["key"])
        lines.append(f"Job <{label}> is being terminated")
    return "\n".join(lines), 255 if errors else 0, errors


def epilogue(rec: dict) -> None:
    """Append LSF's job report to the job's output file (or the mail file)."""
    lsf = rec["lsf"]
    host = emucore.hostname()
    user = lsf["user"]
    done = rec["exit_code"] == 0 and not rec["signal"] and not rec["term_reason"]
    code = 128 + rec["signal"] if rec["signal"] else rec["exit_code"]
    outcome = "Successfully completed." if done else (
        (TERM_TEXT[rec["term_reason"]] + "\n" if rec["term_reason"] in TERM_TEXT else "")
        + f"Exited with exit code {code}.")
    started = time.ctime(rec["start_time"])
    ended = time.ctime(rec["end_time"])
    report = f"""
------------------------------------------------------------
Sender: LSF System <lsfadmin@{host}>
Subject: Job {lsf_id(rec)}: <{lsf['job_name']}> in cluster <{CLUSTER}> {'Done' if done else 'Exited'}

Job <{lsf['job_name']}> was submitted from host <{lsf['from_host']}> by user <{user}> in cluster <{CLUSTER}> at {time.ctime(rec['submit_time'])}
Job was executed on host(s) <{values(rec)['exec_host']}>, in queue <{rec['queue']}>, as user <{user}> in cluster <{CLUSTER}> at {started}
<{rec['run']['cwd']}> was used as the working directory.
Started at {started}
Terminated at {ended}
Results reported at {ended}

Your job looked like:

------------------------------------------------------------
# LSBATCH: User input
{lsf['command']}
------------------------------------------------------------

{outcome}

Resource usage summary:

    CPU time :                                   {rec['cput']:.2f} sec.
    Run time :                                   {int(rec['end_time'] - rec['start_time'])} sec.
    Total Requested Memory :                     -

"""
    with open(lsf["stdout"], "a") as fh:
        fh.write(report)


def lsf_id(rec: dict) -> str:
    return str(rec["seq"]) if rec["index"] is None else f"{rec['seq']}[{rec['index']}]"


def run(func) -> None:
    try:
        text, code, errors = func(sys.argv[1:])
    except EmulatorError as exc:
        print(exc.message, file=sys.stderr)
        sys.exit(exc.code)
    if text:
        print(text)
    sys.stdout.flush()
    for line in errors:
        print(line, file=sys.stderr)
    sys.exit(code)
