"""The results document as its readers take it: one JSON Schema, its limits, and where it came from.

A results file is written by ``chaos run`` (``chaos.run.results`` for the built-in workload,
``chaos.run.results.job_results_document`` for ``chaos run -- COMMAND``) and read back by ``chaos report``,
``chaos replay``, ``chaos findings`` and ``chaos repro`` — often from a CI artifact, that
is, from someone else. Each of them calls :func:`load_results`, which

1. reads the file through ``reports.jsonfile.read_json`` (regular files only, at most
   ``MAX_JSON_BYTES``, nesting at most ``MAX_JSON_DEPTH``), then
2. validates the document against :data:`SCHEMA` (JSON Schema 2020-12, checked by the
   ``jsonschema`` library), which types every field a reader uses: a document that
   passes cannot make a reader fail with a TypeError or an AttributeError. The first
   violation becomes one ``ConfigError`` line naming the file and the JSON path of the
   wrong field (``R.json is not a chaos results JSON: $.scenarios[3].verdict is 'maybe',
   not one of pass, fail, error, skipped``).

The schema accepts both writers' documents as they are, and those written before
``origin`` existed; keys it does not name are allowed (a newer writer's extra fields do
not break an older reader), only the values of maps keyed by rank or name are typed.

Where a document came from (``origin``)
---------------------------------------
``chaos replay`` runs what a results file says: a job's COMMAND in its recorded
directory, or a checkpointer file the built-in workload imports. It runs that without
asking only when the file provably was written by this user on this host
(:func:`not_ours` returns None); otherwise it needs ``--yes`` (or a "y" at a
terminal). The proof is ``origin``: the writer records its host name and uid and an
HMAC-SHA256, keyed by a random per-user key (:func:`origin_key_path`, created 0600 on
first use, never written into any document), over exactly what a replay would run
(:func:`replay_inputs`: the job's spec and each point's id, verdict, seed and anchor;
each built-in scenario's id, verdict and spec). Why a key rather than the file's owner
and mode, or a recorded host and uid alone: the harness runs as root on shared CI
runners, where an artifact downloaded by root is owned by root and mode 0644 like any
file root wrote, and a host name and uid are easy to guess or copy from a published
artifact of ours. Without the key nobody can make a tag that matches changed contents,
and a genuine record copied into a document with another command does not match it.
A results file written before ``origin`` existed, on another host, by another user, or
edited since is "not provably ours", and the refusal says which.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import socket
import stat
from pathlib import Path
from typing import Any

from chaos.errors import ConfigError

VERDICTS = ("pass", "fail", "error", "skipped")

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_SCALAR = {"type": ["string", "number", "boolean", "null"]}


def _maybe(kind: str | list[str]) -> dict[str, Any]:
    kinds = [kind] if isinstance(kind, str) else kind
    return {"type": [*kinds, "null"]}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _object(properties: dict[str, Any] | None = None, required: tuple[str, ...] = (),
            values: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object"}
    if properties:
        out["properties"] = properties
    if required:
        out["required"] = list(required)
    if values is not None:
        out["additionalProperties"] = values
    return out


# One fault of a scenario (chaos.model.fault.Fault.to_dict, chaos.model.jobspec.Point.to_fault):
# ``params`` holds scalars only; those chaos repro words are typed.
_FAULT = _object({
    "kind": _STR, "rank": _maybe("integer"), "step": _maybe("integer"), "attempt": _maybe("integer"), "spec": _STR,
    "params": _object({"when": _maybe("string"), "event": _maybe("string"), "path": _maybe("string"),
                       "nth": _maybe("integer"), "op": _maybe(["integer", "string"]), "seq": _maybe("integer"),
                       "at_step": _maybe("integer"), "seed": _maybe("integer"), "size_bytes": _maybe("integer"),
                       "grace_s": _NUM, "hold_s": _NUM}, values=_SCALAR),
})
# What the harness did at a job's point (``fault_applied``: atrest, netcut), as chaos repro words it.
_APPLIED = _object({"what": _maybe("string"), "hold_s": _NUM,
                    "copies": _array(_object({"copy": _maybe("integer"), "ended": _maybe("string"),
                                              "returncode": _maybe("integer"), "cause": _maybe("string")}))})
# An event of the built-in workload's timeline (reports.html draws these; keys of its dicts are scalars).
_EVENT = _object({"t": _maybe("number"), "ev": _maybe("string"), "rank": _maybe("integer"),
                  "attempt": _maybe("integer"), "step": _maybe("integer"), "steps": _array(_maybe("integer")),
                  "seconds": _maybe("number"), "wait_seconds": _maybe("number")})
_ATTEMPT = _object({"attempt": _maybe("integer"), "outcome": _maybe("string"), "started": _maybe("number"),
                    "ended": _maybe("number"), "seconds": _maybe("number"), "detail": _maybe("string"),
                    "exit_codes": _object(values=_SCALAR), "returncodes": _array(_SCALAR),
                    "fired": _array({"type": "object"})})
_ORACLE = _object({"result": _STR, "summary": _maybe("string"), "evidence": _maybe(["object", "string"])})
# The job's spec (chaos.model.jobspec.JobSpec.to_dict): what chaos replay and chaos repro rerun.
_JOB_SPEC = _object({
    "command": {"type": "array", "items": _STR, "minItems": 1}, "resume_command": {**_maybe("array"), "items": _STR},
    "ranks": _maybe("integer"), "world_size": {"type": "integer", "minimum": 1}, "torchrun": _BOOL,
    "result_files": _array(_STR), "step_regex": _maybe("string"), "loss_regex": _maybe("string"),
    "loss_band": _maybe("number"), "checkpoint_glob": _maybe("string"), "max_restarts": _INT,
    "timeout_s": _NUM, "hang_timeout_s": _maybe("number"), "rtol": _NUM, "modes": _array(_STR), "faults": {**_maybe("array"), "items": _STR},
    "grace_s": _NUM, "net_hold_s": _NUM, "cwd": _STR, "nodes": _maybe("integer"), "node_hold_s": _NUM,
    "launcher": _STR, "sbatch_options": _array(_STR),  # --launcher sbatch only (absent: subprocess)
    "image": _STR,  # --launcher docker --image only
}, required=("command",))
# The built-in scenario's spec (chaos.plan.scenario.Scenario.to_dict), or a job point's ({kind: job, job, point}).
_SCENARIO_SPEC = _object({
    "kind": _STR, "job": _JOB_SPEC, "point": _STR, "id": _STR, "checkpointer": _STR,
    "world_size": {"type": "integer", "minimum": 1},
    "workload": _object({"seed": _INT, "steps": _INT, "save_every": _INT}, values=_SCALAR),
    "faults": _array(_FAULT), "ckpt_options": _object(values=_SCALAR), "backend": _STR,
    "max_restarts": _INT, "loss_band": _maybe("number"), "driver": _STR, "image": _maybe("string"),
})
_SCENARIO = _object({
    "id": {"type": "string", "minLength": 1}, "verdict": {"enum": list(VERDICTS)}, "outcome": _maybe("string"),
    "summary": _maybe("string"), "replay": _maybe("string"), "error": _maybe("string"),
    "seconds": _maybe("number"), "seed": _maybe("integer"), "checkpointer": _maybe("string"),
    "backend": _maybe("string"), "world_size": _maybe("integer"), "golden_cached": _maybe("boolean"),
    "drift": _maybe("string"), "faults": _array(_FAULT), "fired": _array({"type": "object"}),
    "fault_applied": {**_APPLIED, "type": ["object", "null"]}, "oracles": _object(values=_ORACLE),
    "attempts": _array(_ATTEMPT), "scenario": _SCENARIO_SPEC, "timeline": _array(_EVENT), "io": _maybe("object"),
    "losses": _object(values=_array(_object({"step": _INT, "loss": _maybe("number"), "attempt": _maybe("integer"),
                                             "t": _maybe("number")}))),
    "golden_losses": _object(values=_array(_maybe("number"))),
}, required=("id", "verdict"))
_JOB = _object({
    "spec": _JOB_SPEC, "outcomes": _object(values=_INT), "points_found": _INT, "points_chosen": _INT,
    "points_tried": _INT, "coverage": _NUM, "budget_s": _maybe("number"), "seconds": _NUM,
    "faults": _object({"found": _object(values=_INT), "tried": _object(values=_INT)}),
    "reference": _object({"notes": _array(_STR), "tolerance_mode": _BOOL, "untraced_files": _array(_STR)}),
    # a run stopped by SIGINT / SIGTERM (chaos.run.explore.interrupt_record): its points cut short are
    # scenarios with verdict skipped and outcome "interrupted", so readers older than this key still read them
    "interrupted": _object({"signal": _STR, "during": _STR, "after": _INT, "of": _INT, "points": _array(_STR)}),
    # --executor slurm (chaos.run.slurmexec): the array jobs that ran the points, tasks retried, points lost
    "executor": _object({"kind": _STR, "tasks": _INT,
                         "arrays": _array(_object({"job_id": _STR, "tasks": _array(_INT)})),
                         "retried": _array(_INT), "lost": _array(_STR)}, required=("kind",)),
}, required=("spec",))
ORIGIN = _object({"host": _STR, "uid": _INT, "mac": _STR}, required=("host", "uid", "mac"))

# The results document of both builders (chaos.run.results.results_document and job_results_document).
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "chaos results document",
    **_object({
        "schema_version": _INT,
        "summary": _object(values=_INT),
        "environment": _object({"chaos": _maybe("string"), "torch": _maybe("string"), "python": _maybe("string"),
                                "platform": _maybe("string"), "packages": _object(values=_STR),
                                # --launcher docker: the engine's url and version, the image and its id
                                "docker": _object({"url": _STR, "engine": _maybe("string"), "image": _STR,
                                                   "image_id": _STR, "host_mounted": {"type": "boolean"}})}),
        "scenarios": _array(_SCENARIO),
        "job": _JOB,
        "campaign": _maybe("object"),
        "origin": ORIGIN,
    }, required=("scenarios",)),
}

_JSON_TYPES = {"object": "an object", "array": "an array", "string": "a string", "integer": "an integer",
               "number": "a number", "boolean": "true or false", "null": "null"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value) if not isinstance(value, dict | list) else _JSON_TYPES[_json_type(value)]
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _explain(error: Any) -> str:
    """One jsonschema error as '<JSON path> <what is wrong>', short whatever the value's size."""
    where, value, rule, expected = error.json_path, error.instance, error.validator, error.validator_value
    if rule == "type":
        kinds = [expected] if isinstance(expected, str) else list(expected)
        want = " or ".join(_JSON_TYPES.get(k, k) for k in kinds)
        return f"{where} must be {want}, not {_JSON_TYPES[_json_type(value)]}"
    if rule == "required":
        missing = next((k for k in expected if k not in value), expected[0])
        return f"{where} has no {missing!r}"
    if rule == "enum":
        return f"{where} is {_short(value)}, not one of {', '.join(map(str, expected))}"
    if rule in ("minimum", "minItems", "minLength"):
        what = {"minimum": "at least", "minItems": "an array of at least", "minLength": "a string of at least"}[rule]
        unit = {"minItems": " item(s)", "minLength": " character(s)"}.get(rule, "")
        return f"{where} is {_short(value)}: it must be {what} {expected}{unit}"
    return f"{where}: {error.message[:200]}"


@functools.cache
def _validator() -> Any:
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(SCHEMA)
    return Draft202012Validator(SCHEMA)


def check_results(doc: Any, source: str) -> dict[str, Any]:
    """``doc`` if it is a results document; else ConfigError naming ``source``.

    The first schema violation found is the one reported: enough to fix, and found
    without scanning the rest of a document with a million of them.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("scenarios"), list):
        got = f"; got {_JSON_TYPES[_json_type(doc)]}" if not isinstance(doc, dict) else (
            "; it has no 'scenarios'" if "scenarios" not in doc else
            f"; its 'scenarios' is {_JSON_TYPES[_json_type(doc['scenarios'])]}")
        raise ConfigError(f"{source} is not a chaos results JSON: expected an object with a 'scenarios' list{got}")
    error = next(iter(_validator().iter_errors(doc)), None)
    if error is not None:
        raise ConfigError(f"{source} is not a chaos results JSON: {_explain(error)}")
    return doc


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check a results file: every problem is one ConfigError naming it. Called by ``chaos
    report``, ``chaos replay``, ``chaos findings`` and ``chaos repro``; whether it must be a job's results
    (findings, repro) is theirs to say."""
    from reports.jsonfile import read_json

    return check_results(read_json(path, "results"), str(path))


# -- origin ----------------------------------------------------------------------------

_MAC_CONTEXT = b"chaos results origin v1\0"


def origin_key_path() -> Path:
    """The per-user key: ``$XDG_STATE_HOME/chaos/origin.key`` (default ``~/.local/state/chaos/origin.key``).

    State, not cache: a CI cache restored into ``~/.cache`` could carry someone else's key.
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "chaos" / "origin.key"


def _read_key(path: Path) -> bytes | None:
    """The key at ``path`` if it is a regular file of this user's that nobody else can read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        key = f.read(256).strip()
    return key if len(key) >= 32 else None


def origin_key(create: bool = False) -> bytes | None:
    """This user's key (made with ``create`` when there is none); None where there is none to be had.

    Made as a temporary file then linked into place, so concurrent first runs agree on one key.
    """
    path = origin_key_path()
    key = _read_key(path)
    if key is not None or not create:
        return key
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_hex(32).encode() + b"\n")
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another run made it first: use that one
        finally:
            os.unlink(tmp)
    except OSError:
        return None
    return _read_key(path)


def replay_inputs(doc: dict[str, Any]) -> dict[str, Any]:
    """What ``chaos replay`` of ``doc`` would run, and nothing else: what the origin tag covers.

    For a job: its spec, and each point's id, verdict, seed and recorded replay point (its
    anchor); for the built-in workload: each scenario's id, verdict and spec.
    """
    scenarios = [s for s in doc.get("scenarios") or [] if isinstance(s, dict)]
    job = doc.get("job")
    if isinstance(job, dict):
        return {"job": job.get("spec"),
                "points": [[s.get("id"), s.get("verdict"), s.get("seed"),
                            (s.get("scenario") or {}).get("point") if isinstance(s.get("scenario"), dict) else None]
                           for s in scenarios]}
    return {"scenarios": [[s.get("id"), s.get("verdict"), s.get("scenario")] for s in scenarios]}


def _mac(key: bytes, host: str, uid: int, doc: dict[str, Any]) -> str:
    # As a reader will parse it: the writer's values through JSON first (default=str, as written).
    inputs = json.loads(json.dumps(replay_inputs(doc), default=str))
    body = json.dumps([host, uid, inputs], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "hmac-sha256:" + hmac.new(key, _MAC_CONTEXT + body.encode("ascii"), hashlib.sha256).hexdigest()


def origin_record(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The ``origin`` entry a writer adds to ``doc`` (None where this user can have no key).
    Called by ``chaos.run.results`` each time it builds a document."""
    key = origin_key(create=True)
    if key is None:
        return None
    host, uid = socket.gethostname(), os.getuid()
    return {"host": host, "uid": uid, "mac": _mac(key, host, uid, doc)}


def not_ours(doc: dict[str, Any]) -> str | None:
    """None when ``doc`` was written by this user on this host and what it would replay is unchanged;
    else why not, as a clause for a one-line refusal. Called by ``chaos replay``."""
    origin = doc.get("origin")
    if not isinstance(origin, dict):
        return ("it records no origin (written by hand, elsewhere, or by a chaos older than the origin record), "
                "so it is not provably yours")
    host, uid = origin.get("host"), origin.get("uid")
    here = socket.gethostname()
    if host != here:
        return f"it was written on host {_short(host)}, not on this host ({here})"
    if uid != os.getuid():
        return f"it was written by uid {_short(uid)}, not by you (uid {os.getuid()})"
    key = origin_key()
    if key is None:
        return f"you have no origin key ({origin_key_path()}) to check its origin with"
    if not hmac.compare_digest(str(origin.get("mac")), _mac(key, here, os.getuid(), doc)):
        return "its origin record does not match what it would run (edited since it was written, or forged)"
    return None
