"""Every code example of the documentation site and the README, run as a reader runs it.

The pages are scanned for fenced blocks; a block runs as a script of its own in a fresh
interpreter, in a temporary directory, with a timeout, its whole process group ended
after (a ``LocalCluster`` it started included), also when it fails. How a block runs is
said by an HTML comment on the line before its fence, which neither GitHub nor the site
shows:

* no comment on a ``python`` block: run it with ``python``;
* ``<!-- example: continue -->``: this block follows the page's previous block; both run
  as one script (a definition shown, then its use);
* ``<!-- example: mpi N -->``: run it as ``mpiexec -n N python -m hpcsched script.py``;
* ``<!-- example: slurm -->``: run it (``python``, or ``bash`` for a shell block) against
  the real SLURM (the ``slurm`` fixture: skips when SLURM does not answer, unless CI
  requires it). Its batch jobs get a name of this test's own (``SBATCH_JOB_NAME``, and the
  clusters' ``jobqueue.slurm.name``), by which whatever it leaves is cancelled;
* ``<!-- example: sh -->`` (on a ``bash`` block): run it with ``bash -e``;
* ``<!-- example: skip REASON -->``: shown, not run; the reason must be said (a batch
  system, a GPU or a site this machine has not).

A ``python`` block without a comment is run: an example added without thought is tested.
Shell and YAML blocks run only when marked, as most show a site's own commands.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import REPO

ROOT = Path(REPO)
PAGES = sorted([ROOT / "README.md", *(p for p in (ROOT / "docs").rglob("*.md")
                                      if "_build" not in p.parts)])
FENCE = re.compile(r"(?:<!-- example: (?P<mode>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```",
                   re.DOTALL)
TIMEOUT = 240  # seconds a block may take on a loaded machine (a LocalCluster starts in it)


@dataclass
class Example:
    page: Path
    line: int
    lang: str
    mode: str
    code: str
    before: list[str] = field(default_factory=list)  # blocks it continues

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def script(self) -> str:
        return "\n".join([*self.before, self.code])


def examples() -> list[Example]:
    found: list[Example] = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            mode = (m.group("mode") or "").strip()
            line = text.count("\n", 0, m.start("code"))
            ex = Example(page, line, m.group("lang"), mode, m.group("code"))
            if mode == "continue":
                assert found and found[-1].page == page, f"{ex.id}: continues nothing"
                prev = found.pop()  # the chain runs once, at its last block
                ex.lang, ex.mode, ex.before = prev.lang, prev.mode, [*prev.before, prev.code]
            found.append(ex)
    return [e for e in found if e.lang == "python" or e.mode]


EXAMPLES = examples()


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``cmd`` with its output in a file (a server it left in the background may hold
    a pipe open), until it exits or the timeout; then end its whole process group."""
    log = cwd / "example.out"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(TIMEOUT)
    except subprocess.TimeoutExpired:
        # SIGTERM first: a batch cluster cancels its jobs on it
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the example left running
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait(10)
    timed_out = f"\n(ended after {TIMEOUT} s)" if proc.returncode in (-15, -9) else ""
    return subprocess.CompletedProcess(cmd, proc.returncode, log.read_text() + timed_out, "")


def jobs_named(name: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "--name", name, "-o", "%i"], capture_output=True,
                         text=True, timeout=30).stdout
    return out.split()


def test_examples_were_found():
    assert len(EXAMPLES) >= 20, [e.id for e in EXAMPLES]


def test_every_skipped_example_says_why():
    for e in EXAMPLES:
        if e.mode.startswith("skip"):
            assert len(e.mode.split(maxsplit=1)) == 2, f"{e.id}: skip without a reason"
        else:
            assert re.fullmatch(r"|continue|mpi \d+|slurm|sh", e.mode), \
                f"{e.id}: unknown example mode {e.mode!r}"


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_runs(example: Example, tmp_path: Path, request: pytest.FixtureRequest):
    if example.mode.startswith("skip"):
        pytest.skip(example.mode)
    job_name = f"docs-example-{os.getpid()}-{example.line}"
    if example.mode == "slurm":
        request.getfixturevalue("slurm")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HPCSCHED_SCHEDULER", "HPCSCHED_SECRET", "HPCSCHED_CONFIG"))}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    if example.mode == "slurm":
        env.update(SBATCH_JOB_NAME=job_name, HPCSCHED_JOBQUEUE__SLURM__NAME=job_name)
    if example.lang == "bash":
        (tmp_path / "example.sh").write_text(example.script)
        cmd = ["bash", "-e", "example.sh"]
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
        (tmp_path / "examples").symlink_to(ROOT / "examples")  # as from the checkout
        cwd = tmp_path
    else:
        script = tmp_path / "example.py"
        script.write_text(example.script)
        cwd = tmp_path
        if example.mode.startswith("mpi"):
            n = example.mode.split()[1]
            cmd = ["mpiexec", "-n", n, sys.executable, "-m", "hpcsched", str(script)]
        else:
            cmd = [sys.executable, str(script)]
    try:
        result = run(cmd, cwd, env)
    finally:
        if example.mode == "slurm" and (left := jobs_named(job_name)):
            subprocess.run(["scancel", *left], timeout=30)
    assert result.returncode == 0, f"{example.id} failed:\n{example.script}\n---\n" \
                                   f"{result.stdout[-4000:]}"
