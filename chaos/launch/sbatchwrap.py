"""The batch script of ``chaos run --launcher sbatch``: one run of the job under Slurm, and its record.

``chaos.launch.sbatch`` submits ``exec PYTHON -S -E sbatchwrap.py CONFIG.json`` with
``sbatch --requeue``; Slurm runs it once, and again after each requeue (a sched point, a
node lost). Each run:

- takes its attempt number from ``SLURM_RESTART_COUNT`` (Slurm's count of this job's
  requeues; absent on the first run) plus the harness's attempt it was submitted for, so
  the traces of a rerun are attempt 1, 2, ... and the point, armed only in attempt 0 by the
  job's tracer, never fires again; a rerun runs ``--resume-cmd`` where one was given;
- records where and when it started (``run-a<A>.json``), runs the job with its output in
  ``logs/attempt<A>-copy0.log``, and records the job's status (``rc-a<A>.json``: negative
  where a signal killed it, as ``subprocess`` says it) and when a SIGTERM reached this
  script; a run SIGKILLed by Slurm (after ``KillWait``) leaves no status, which the
  harness reads as SIGKILL.

It catches SIGTERM only to note it: Slurm signals every process of the job, the job itself
included, and the job decides what to do. Standard library only, run with ``-S -E``: the
job's environment puts the harness's boot path on PYTHONPATH, and this script is no rank
to trace.
"""

import json
import os
import signal
import subprocess
import sys
import time


def _write(path: str, record: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def main(config: str) -> int:
    with open(config) as f:
        cfg = json.load(f)
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    attempt = cfg["base"] + (int(restarts) if restarts.isdigit() else 0)
    argv = cfg["resume_argv"] if attempt > 0 else cfg["argv"]
    env = dict(os.environ)
    env[cfg["attempt_env"]] = str(attempt)
    env[cfg["mark_env"]] = f"{cfg['mark']}#attempt{attempt}"
    if attempt > 0:
        env.pop(cfg["point_env"], None)
    runs = cfg["runs"]
    _write(os.path.join(runs, f"run-a{attempt}.json"),
           {"attempt": attempt, "restart_count": attempt - cfg["base"], "job_id": env.get("SLURM_JOB_ID"),
            "node": env.get("SLURMD_NODENAME"), "started": time.time(), "argv": argv})
    sigterm: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: sigterm.append(time.time()))
    with open(os.path.join(cfg["logs"], f"attempt{attempt}-copy0.log"), "ab") as log:
        try:
            proc = subprocess.Popen(argv, cwd=cfg["cwd"], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
        except OSError as exc:
            log.write(f"cannot start COMMAND {argv[0]!r}: {exc.strerror}\n".encode())
            rc = 127
        else:
            rc = proc.wait()
    _write(os.path.join(runs, f"rc-a{attempt}.json"), {"returncode": rc, "ended": time.time(), "sigterm": sigterm})
    return rc if 0 <= rc < 256 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
