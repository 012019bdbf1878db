"""One grammar for both targets (chaos.model.grammar, issue #28): either spelling, one meaning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos.errors import ConfigError
from chaos.model.fault import FAULT_KINDS, Fault
from chaos.model.grammar import parse_fault, parse_point
from chaos.model.point import Point

REPO = Path(__file__).resolve().parents[1]

SAME_FAULT = [
    ("rank1:step11:kill", "kill:rank=1,step=11"),
    ("rank1:step11:kill,phase=vote,lost=true", "kill:rank=1,step=11,phase=vote,lost=true"),
    ("rank0:step12:term,grace=2", "term:rank=0,step=12,grace=2"),
    ("rank1:step9:stop", "stop:rank=1,step=9"),
    ("rank1:step5:net", "netdrop:rank=1,step=5"),
    ("rank0:step4:crash,op=write,nth=1", "crash:rank=0,step=4,op=write,nth=1"),
    ("rank0:eio,op=fsync", "eio:rank=0,op=fsync"),
    ("rank1:shortwrite,byte=100,path=*.safetensors,keep=3", "shortwrite:rank=1,byte=100,path=*.safetensors,keep=3"),
    ("ckpt:step8:bitflip,bits=2,region=header", "bitflip:step=8,bits=2,region=header"),
    ("ckpt:step8:payload,format=torchzip", "payload:step=8,format=torchzip"),
    ("disk:step8:full,free=4096", "diskfull:step=8,free=4096"),
    ("all:step8:power,seed=1,max_states=4", "powerloss:step=8,seed=1,max_states=4"),
    ("rank1:step3:kill,attempt=1", "kill:rank=1,step=3,attempt=1"),
]


@pytest.mark.parametrize(("place", "older"), SAME_FAULT)
def test_a_built_in_fault_means_the_same_in_either_spelling(place: str, older: str) -> None:
    assert parse_fault(place) == parse_fault(older)
    assert parse_fault(parse_fault(place).spec()) == parse_fault(place)  # what a replay prints reads back


@pytest.mark.parametrize(("older", "place"), [("kill:rank=0,step=5", "rank0:step5:kill"),
                                              ("term:rank=2,step=1", "rank2:step1:term"),
                                              ("netdrop:rank=1,step=5", "rank1:step5:net")])
def test_a_job_takes_a_step_kill_term_or_cut_in_the_built_in_spelling(older: str, place: str) -> None:
    assert parse_point(older) == parse_point(place) == Point(int(place[4]), place.rsplit(":", 1)[1],
                                                              step=int(place.split(":")[1][4:]))


@pytest.mark.parametrize(("text", "says"), [
    ("rank0:op17:before", "a job's point: --point"),
    ("disk:full:8192", "disk:stepS:full,free=BYTES"),
    ("node1:step3:loss", "no fault of the built-in workload"),
    ("rank0:step3:bitflip", "a rank's fault is one of"),
    ("ckpt:step3:kill", "the newest checkpoint's fault is one of"),
    ("rank0:kill", "kill fires at a step: rank0:stepS:kill"),
    ("rank0:step5:kill@write:a:1", "malformed --fault"),
])
def test_a_fault_only_a_job_can_take_is_refused_naming_the_other_option(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"'{text}'") as e:
        parse_fault(text)
    assert says in str(e.value)


@pytest.mark.parametrize(("text", "says"), [
    ("hang:rank=0,step=3", "malformed --point"),
    ("kill:rank=0,step=5,lost=yes", "lost must be true or false"),
    ("rank0:step5:kill,phase=vote,lost=no", "lost must be true or false"),
    ("rank0:op5:before,phase=vote", "takes no KEY=VALUE settings"),
    ("frob:x=1", "malformed --point"),
    ("rank0:op9:before=ckpt/a.pt", "only a fault at rest names the file it strikes"),
    ("rank0:op9:payload=/etc/passwd", "must be a plain path relative to {out}"),
    ("rank0:op9:payload=ckpt/../../x", "must be a plain path relative to {out}"),
])
def test_a_point_only_the_built_in_workload_can_take_is_refused_naming_the_other_option(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"'{text}'") as e:
        parse_point(text)
    assert says in str(e.value)


_STEP_KINDS = sorted(k for k, spec in FAULT_KINDS.items() if spec.needs_step and spec.family != "io")


@given(kind=st.sampled_from(_STEP_KINDS), rank=st.integers(0, 7), step=st.integers(1, 99),
       attempt=st.integers(0, 3))
def test_every_step_fault_reads_the_same_both_ways(kind: str, rank: int, step: int, attempt: int) -> None:
    spec = FAULT_KINDS[kind]
    fault = Fault(kind, rank if spec.needs_rank else None, step, attempt)
    who = {"diskfull": "disk", "powerloss": "all"}.get(kind, f"rank{rank}" if spec.needs_rank else "ckpt")
    what = {"diskfull": "full", "powerloss": "power", "netdrop": "net"}.get(kind, kind)
    place = f"{who}:step{step}:{what}" + (f",attempt={attempt}" if attempt else "")
    assert parse_fault(place) == parse_fault(fault.spec()) == fault


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "chaos.cli.main", "run", "--json", str(out), "--scratch", str(tmp_path),
                           *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "CHAOS_CACHE_DIR": str(tmp_path / "cache"),
                               "HOME": str(tmp_path)})
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow  # nightly: tests/test_cli.py's replay test runs a --fault and checks the printed grammar
def test_the_command_line_runs_a_fault_written_in_the_grammar(tmp_path: Path) -> None:
    """The built-in workload, end to end: the older spelling in, the grammar in the record and replay."""
    doc = _run(tmp_path, "--steps", "6", "--save-every", "2", "--fault", "kill:rank=1,step=3")
    (s,) = doc["scenarios"]
    assert [f["spec"] for f in s["faults"]] == ["rank1:step3:kill"] and s["id"] == "reference-rank1_step3_kill-seed0"
    assert s["verdict"] == "pass" and "--fault rank1:step3:kill" in s["replay"]


def test_a_job_runs_a_point_written_in_the_built_in_spelling(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--point", "kill:rank=0,step=5", "--result-file", "final.json", "--",
               sys.executable, str(REPO / "chaos" / "examples" / "careless_job.py"), "--out", "{out}")
    (s,) = doc["scenarios"]
    assert s["id"] == "rank0:step5:kill" and s["fired"] and s["verdict"] == "pass"
    assert "--point rank0:step5:kill" in s["replay"]
