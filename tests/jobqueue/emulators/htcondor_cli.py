"""``condor_submit``, ``condor_q``, ``condor_history``, ``condor_rm`` of the HTCondor emulator.

Written from the HTCondor manual (``condor_submit``: "Submit Description File Commands",
"Macros", "About Requirements and Rank"; ``condor_q`` / ``condor_history``: ``-af:j``;
``condor_rm``; "Job ClassAd Attributes"):

* ``condor_submit FILE`` reads ``key = value`` commands (keys case-insensitive; ``+Attr``
  and ``MY.Attr`` set job attributes) up to ``Queue [N]``; ``$(ClusterId)``,
  ``$(Cluster)``, ``$(ProcId)``, ``$(Process)`` and other commands' ``$(name)`` expand,
  ``$F(x)`` is ``x`` without quotes. ``Arguments = "..."`` follows the "new" quoting
  rules (space-separated; ``'...'`` groups; ``''`` and ``""`` are a literal quote).
  It prints ``Submitting job(s).`` and ``N job(s) submitted to cluster C.``.
* A job runs ``Executable`` with those arguments in a scratch directory, with an
  environment of its own (no ``getenv``): ``_CONDOR_JOB_AD`` names a file holding the job
  ad (``ClusterId``, ``ProcId``, ``RequestCpus``, ``RequestMemory``, ...),
  ``_CONDOR_SCRATCH_DIR`` and ``OMP_NUM_THREADS`` (= ``RequestCpus``) are set, and
  ``Environment = "NAME=value ..."`` (new syntax, quoted as arguments). ``Output``
  and ``Error`` may name one file. ``periodic_remove = (JobStatus == 2) && (time() -
  EnteredCurrentStatus > N)`` removes a job N seconds after it started.
* ``condor_q -af:j ATTRS IDS`` prints ``C.P v1 v2`` for jobs still in the queue
  (``JobStatus`` 1 idle, 2 running, 3 removed while it exits); ``condor_history`` the
  same for jobs that left it (4 completed, with ``ExitCode``; 3 removed); a missing
  value is ``undefined``.
* ``condor_rm IDS`` prints ``Job C.P marked for removal``; a job not in the queue:
  ``Couldn't find/remove all jobs matching ...`` / ``Job C.P not found``, exit 1.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import emucore
import emusys
from emucore import EmulatorError

STATUS = {emucore.QUEUED: "1", emucore.HELD: "5", emucore.RUNNING: "2", emucore.EXITING: "2"}


def split_arguments(text: str) -> list[str]:
    """The "new" syntax of ``Arguments`` (between its double quotes)."""
    args: list[str] = []
    current: list[str] | None = None
    i, quoted = 0, False
    while i < len(text):
        c = text[i]
        if c == '"' and text[i : i + 2] == '""':
            (current := current if current is not None else []).append('"')
            i += 2
            continue
        if c == "'":
            if quoted and text[i : i + 2] == "''":
                current.append("'")  # type: ignore[union-attr]
                i += 2
                continue
            quoted = not quoted
            current = current if current is not None else []
        elif c.isspace() and not quoted:
            if current is not None:
                args.append("".join(current))
                current = None
        else:
            (current := current if current is not None else []).append(c)
        i += 1
    if quoted:
        raise EmulatorError("ERROR: Arguments: unterminated single quote", 1)
    if current is not None:
        args.append("".join(current))
    return args


def _expand(value: str, macros: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        func, name = m.group(1), m.group(2)
        got = macros.get(name.lower(), macros.get(name.lower().removeprefix("my."), ""))
        return got.strip('"') if func == "F" else got

    for _ in range(5):  # macros may name macros
        new = re.sub(r"\$(F?)\(([A-Za-z0-9_.+]+)\)", one, value)
        if new == value:
            break
        value = new
    return value


def _evaluate(expr: str, ad: dict[str, str]) -> int | None:
    """A number, ``MY.Attr`` or ``floor(MY.Attr / N)``: what request_* are written as."""
    expr = expr.strip()
    m = re.fullmatch(r"floor\(\s*(\S+)\s*/\s*(\d+)\s*\)", expr)
    if m:
        inner = _evaluate(m.group(1), ad)
        return None if inner is None else math.floor(inner / int(m.group(2)))
    if re.fullmatch(r"-?\d+", expr):
        return int(expr)
    name = expr.removeprefix("MY.").lower()
    return _evaluate(ad[name], ad) if name in ad else None


def condor_submit(argv: list[str]) -> str:
    files = [a for a in argv if not a.startswith("-")]
    if len(files) != 1:
        raise EmulatorError("ERROR: this emulator reads one submit file", 1)
    try:
        lines = Path(files[0]).read_text().splitlines()
    except OSError:
        raise EmulatorError(f'ERROR: Can\'t open "{files[0]}" with flags 00', 1) from None
    commands: dict[str, str] = {}
    ad: dict[str, str] = {}
    count = None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"queue(?:\s+(\d+))?", line, re.IGNORECASE)
        if m:
            count = int(m.group(1) or 1)
            break
        key, eq, value = line.partition("=")
        if not eq:
            raise EmulatorError(f"ERROR: on Line {number} of submit file: {line}", 1)
        key = key.strip()
        if key.startswith("+") or key.upper().startswith("MY."):
            ad[key.lstrip("+").split(".", 1)[-1].lower()] = value.strip()
        else:
            commands[key.lower()] = value.strip()
    if count is None:
        raise EmulatorError("ERROR: no 'queue' command in the submit file", 1)
    if "executable" not in commands:
        raise EmulatorError("ERROR: No 'executable' parameter was provided", 1)
    store = emucore.Store(emucore.state_dir("condor_submit"))
    walltime = None
    remove = commands.get("periodic_remove", "")
    m = re.search(r"time\(\)\s*-\s*EnteredCurrentStatus\s*>\s*(\d+)", remove)
    if m and "JobStatus == 2" in remove:
        walltime = float(m.group(1))

    def macros(seq: int, index: int | None) -> dict[str, str]:
        proc = str(index or 0)
        return {
            **commands,
            **ad,
            "clusterid": str(seq),
            "cluster": str(seq),
            "procid": proc,
            "process": proc,
        }

    def value(seq: int, index: int | None, key: str, default: str = "") -> str:
        return _expand(commands.get(key, default), macros(seq, index))

    def argv_of(seq: int, index: int | None) -> list[str]:
        args = value(seq, index, "arguments").strip()
        if args.startswith('"') and args.endswith('"'):
            args = split_arguments(args[1:-1])
        else:
            args = args.split()
        return [value(seq, index, "executable"), *args]

    def log(seq: int, index: int | None) -> tuple[str, str | None]:
        out = value(seq, index, "output", "/dev/null")
        err = value(seq, index, "error", "/dev/null")
        return out, (None if err == out else err)

    def job_env(seq: int, index: int | None) -> dict[str, str]:
        expanded = {k: _expand(v, macros(seq, index)) for k, v in ad.items()}
        cpus = _evaluate(commands.get("requestcpus", "1"), expanded) or 1
        memory = _evaluate(commands.get("requestmemory", "0"), expanded) or 0
        scratch = store.root / "scratch" / f"{seq}.{index or 0}"
        scratch.mkdir(parents=True, exist_ok=True)
        job_ad = scratch / ".job.ad"
        job_ad.write_text(
            "".join(
                f"{k} = {v}\n"
                for k, v in {
                    "ClusterId": seq,
                    "ProcId": index or 0,
                    "RequestCpus": cpus,
                    "RequestMemory": memory,
                    "Owner": f'"{emucore.username()}"',
                    "JobBatchName": f'"{value(seq, index, "batch_name")}"',
                }.items()
            )
        )
        env = {
            "_CONDOR_JOB_AD": str(job_ad),
            "_CONDOR_SCRATCH_DIR": str(scratch),
            "OMP_NUM_THREADS": str(cpus),
        }
        given = value(seq, index, "environment").strip()
        if given.startswith('"') and given.endswith('"'):
            for item in split_arguments(given[1:-1]):
                name, _, val = item.partition("=")
                env[name] = val
        return env

    user_log = value(0, 0, "log")
    seq = emusys.submit(
        "htcondor",
        store,
        argv_of,
        env=emusys.login_env(),
        log=log,
        cwd=str(store.root / "scratch"),
        walltime=walltime,
        count=count,
        job_env=job_env,
        fields=lambda s, i: {"name": value(s, i, "batch_name"), "job_id": f"{s}.{i or 0}"},
    )
    if user_log:
        path = Path(_expand(commands["log"], macros(seq, 0)))
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(
                f"000 ({seq:03d}.000.000) Job submitted from host: <{emucore.hostname()}>\n...\n"
            )
    return f"Submitting job(s){'.' * count}\n{count} job(s) submitted to cluster {seq}."


def _records(store: emucore.Store) -> dict[str, dict]:
    return {r["job_id"]: r for r in store.records() if r["system"] == "htcondor" and "job_id" in r}


def _attribute(rec: dict, name: str, finished: bool) -> str:
    name = name.lower()
    if name == "jobstatus":
        if not finished:
            return "3" if rec["kill"] else STATUS[rec["state"]]
        return "3" if rec["term_reason"] in ("delete", "walltime") else "4"
    if name == "exitcode":
        if finished and rec["term_reason"] is None and rec["signal"] is None:
            return str(rec["exit_code"])
        return "undefined"
    if name in ("clusterid", "procid"):
        return str(rec["seq"] if name == "clusterid" else rec["index"] or 0)
    return "undefined"


def _query(argv: list[str], finished: bool, command: str) -> str:
    attrs: list[str] = []
    ids: list[str] = []
    with_id = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-af"):
            with_id = ":j" in arg
            i += 1
            while (
                i < len(argv)
                and not argv[i].startswith("-")
                and not re.fullmatch(r"\d+(\.\d+)?", argv[i])
            ):
                attrs.append(argv[i])
                i += 1
            continue
        if re.fullmatch(r"\d+(\.\d+)?", arg):
            ids.append(arg)
        elif arg.startswith("-"):
            raise EmulatorError(f"{command}: this emulator knows -af[:j] only, not {arg}", 1)
        i += 1
    if not attrs:
        raise EmulatorError(f"{command}: this emulator prints -af output only", 1)
    store = emucore.Store(emucore.state_dir(command))
    lines = []
    for job_id, rec in sorted(_records(store).items()):
        if (rec["state"] == emucore.FINISHED) != finished:
            continue
        if ids and job_id not in ids and job_id.split(".")[0] not in ids:
            continue
        values = [_attribute(rec, a, finished) for a in attrs]
        lines.append(" ".join(([job_id] if with_id else []) + values))
    return "\n".join(lines)


def condor_q(argv: list[str]) -> str:
    return _query(argv, finished=False, command="condor_q")


def condor_history(argv: list[str]) -> str:
    return _query(argv, finished=True, command="condor_history")


def condor_rm(argv: list[str]) -> str:
    store = emucore.Store(emucore.state_dir("condor_rm"))
    records = _records(store)
    lines, missing = [], []
    for job_id in [a for a in argv if not a.startswith("-")]:
        rec = records.get(job_id)
        if rec is None or rec["state"] == emucore.FINISHED:
            missing.append(job_id)
            continue
        emucore.request_kill(store, rec["key"])
        lines.append(f"Job {job_id} marked for removal")
    if missing:
        raise EmulatorError(
            "\n".join(
                lines
                + ["Couldn't find/remove all jobs matching constraint"]
                + [f"Job {j} not found" for j in missing]
            ),
            1,
        )
    return "\n".join(lines)
