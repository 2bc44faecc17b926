"""The site's "Moving from dask-jobqueue" example (docs/moving/dask-jobqueue.md), run as
written against the real SLURM on localhost: its ``jobqueue.yaml`` in ``~/.config/dask``
and its script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def page_blocks() -> tuple[str, str]:
    section = (ROOT / "docs" / "moving" / "dask-jobqueue.md").read_text()
    yaml_block = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    python_block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert yaml_block and python_block, "the migration page lost its example"
    return yaml_block.group(1), python_block.group(1)


@pytest.mark.slurm
@pytest.mark.timeout(180)
def test_migration_example_runs_unchanged(slurm, tmp_path):
    yaml_text, script = page_blocks()
    home = tmp_path / "home"
    (home / ".config" / "dask").mkdir(parents=True)
    (home / ".config" / "dask" / "jobqueue.yaml").write_text(yaml_text)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HPCSCHED_JOBQUEUE", "DASK_", "HPCSCHED_CONFIG"))}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        # whatever happened, nothing of this cluster may stay queued
        deadline = time.monotonic() + 30
        while (left := [j for j in live_jobs_named("dask-worker-")]) and \
                time.monotonic() < deadline:
            time.sleep(0.3)
        if left:
            subprocess.run(["scancel", *left], timeout=30)
    assert proc.returncode == 0, err[-3000:]
    assert "#SBATCH -J dask-worker-" in out and "#SBATCH --comment=migrated" in out
    assert '--local-directory "$TMPDIR"' in out and "#SBATCH -t 00:10:00" in out
    assert out.rstrip().splitlines()[-1] == "285"
    assert not left


def live_jobs_named(prefix: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True,
                         timeout=30).stdout
    return [ln.split()[0] for ln in out.splitlines()
            if len(ln.split()) > 2 and ln.split()[1].startswith(prefix)
            and ln.split()[2] not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT")]
