"""``chaos run`` as a user runs it, for the tests of a job's fault families.

:func:`run_json` runs the CLI in a subprocess with its own scratch root and results file, and
returns the process with the results document; a run that wrote none fails the test with the
output's tail. :data:`EAGER` is a two-rank job whose rank 0 commits a checkpoint as soon as rank 1's
shard file exists, complete or not. Used by the tests of a job's fault families
(``test_job_stop``, ``test_job_io_faults``, ``test_job_process_settings`` ...).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CARELESS = REPO / "chaos" / "examples" / "careless_job.py"  # writes its checkpoint in place
CAREFUL = REPO / "chaos" / "examples" / "careful_job.py"    # temp file, fsync, rename, fall back

# Two ranks (RANK from --ranks 2); every 3rd step each writes its shard in two writes and fsyncs it;
# rank 0 then "checks its own shard" (0.5 s) and commits (latest, a temp file renamed over) as soon
# as rank 1's shard file exists — complete or not: the bug. Rank 1 waits for that commit. A resume
# reads latest and loads its own shard of that step.
EAGER = """
    import json, os, sys, time
    from chaos import phases, probe

    out, steps, every = sys.argv[1], 12, 3
    rank = int(os.environ["RANK"])

    def shard(s, r):
        return os.path.join(out, f"ckpt-{s}-shard{r}.json")

    w, step = [0.0, 1.0], 0
    latest = os.path.join(out, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            step = int(f.read())
        with open(shard(step, rank)) as f:
            w = json.load(f)["w"]
        probe.resumed(step)
    while step < steps:
        step += 1
        w = [x * 0.9 + 0.1 * (i + rank + step) for i, x in enumerate(w)]
        probe.step(step, sum(w))
        if step % every == 0:
            text = json.dumps({"w": w, "step": step})
            with open(shard(step, rank), "w") as f:
                f.write(text[: len(text) // 2])
                f.flush()
                phases.phase("shard_half", step=step)  # as a checkpointer announces where its save is
                f.write(text[len(text) // 2:])
                f.flush()
                os.fsync(f.fileno())
            if rank == 0:
                time.sleep(0.5)
                while not os.path.exists(shard(step, 1)):
                    time.sleep(0.01)
                with open(latest + ".tmp", "w") as f:
                    f.write(str(step))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(latest + ".tmp", latest)
            else:
                while not (os.path.exists(latest) and open(latest).read() == str(step)):
                    time.sleep(0.01)
            probe.saved(step)
    with open(os.path.join(out, f"final-{rank}.json"), "w") as f:
        json.dump(w, f)
"""



def run_json(scratch: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    """``chaos run --scratch SCRATCH --json SCRATCH/r.json --timeout 120 ARGS...``: the process and its results."""
    results = scratch / "r.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--scratch", str(scratch), "--json",
                           str(results), "--timeout", "120", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(results.read_text())
