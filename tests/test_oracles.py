"""Oracles judged on hand-built records: each one passes the right history and fails the wrong one."""

from chaos.golden import GoldenRun
from chaos.oracles import (
    checksum_detection,
    committed_state,
    durability,
    final_durability,
    hygiene,
    no_false_ack,
)
from chaos.record import RunRecord

GOLD = GoldenRun("k", 1, {0: {}}, {0: []}, {0: {}})
S10 = {"model/w": "a10"}
S20 = {"model/w": "a20"}


def ev(name, attempt, **kw):
    return {"ev": name, "rank": 0, "attempt": attempt, "t": float(kw.pop("t", 0)), **kw}


def record(attempt_events, outcomes=("rank_failed", "ok"), fired=None, verify=None, io=None, hygiene=None):
    attempts = [{"attempt": a, "outcome": o, "detail": "", "fired": (fired or {}).get(a, [])}
                for a, o in enumerate(outcomes)]
    events = {a: {0: evs} for a, evs in enumerate(attempt_events)}
    return RunRecord(1, attempts, events, io or {}, verify or {}, hygiene or {})


FIRST = [ev("save_call", 0, step=10, fingerprint=S10), ev("save_return", 0, step=10),
         ev("save_call", 0, step=20, fingerprint=S20), ev("ack", 0, steps=[10]), ev("save_return", 0, step=20),
         ev("ack", 0, steps=[20]), ev("step", 0, step=23, loss=1.0, loss_hex="0x1p+0", lr=0.1)]


def test_durability_fails_a_resume_older_than_the_newest_ack():
    good = record([FIRST, [ev("resume", 1, step=20, fingerprint=S20)]])
    bad = record([FIRST, [ev("resume", 1, step=10, fingerprint=S10)]])
    assert durability(GOLD, good).passed
    result = durability(GOLD, bad)
    assert not result.passed and "older than the save at step 20" in result.summary
    assert result.evidence["restarts"][0]["lost_steps"] == 13
    assert durability(GOLD, good).evidence["save_interval_steps"] == 10


def test_committed_state_fails_a_load_that_is_not_what_was_saved():
    assert committed_state(GOLD, record([FIRST, [ev("resume", 1, step=20, fingerprint=S20)]])).passed
    mixed = committed_state(GOLD, record([FIRST, [ev("resume", 1, step=20, fingerprint={"model/w": "other"})]]))
    assert not mixed.passed and "model/w: differs" in mixed.summary
    never = committed_state(GOLD, record([FIRST, [ev("resume", 1, step=15, fingerprint=S10)]]))
    assert not never.passed and "never saved" in never.summary


def test_final_durability_wants_the_newest_ack_exactly():
    ok_verify = {"outcome": "ok", "events": {0: [ev("verify", "verify", step=20, fingerprint=S20)]}}
    stale = {"outcome": "ok", "events": {0: [ev("verify", "verify", step=10, fingerprint=S10)]}}
    assert final_durability(GOLD, record([FIRST], outcomes=("ok",), verify=ok_verify)).passed
    result = final_durability(GOLD, record([FIRST], outcomes=("ok",), verify=stale))
    assert not result.passed and result.evidence["loaded_step"] == 10


def test_no_false_ack_flags_an_acknowledged_save_that_hit_an_injected_error():
    io = {"fired": [{"action": "enospc", "op": "write", "path": "/x", "step": 20, "attempt": 0}]}
    result = no_false_ack(GOLD, record([FIRST], outcomes=("ok",), io=io))
    assert not result.passed and "step 20 was acknowledged although it failed" in result.summary
    unacked = [e for e in FIRST if not (e["ev"] == "ack" and e["steps"] == [20])]
    assert no_false_ack(GOLD, record([unacked], outcomes=("ok",), io=io)).passed


def test_checksum_detection_classifies_fallback_and_silent_corruption():
    fired = {0: [{"spec": "bitflip:step=23", "attempt": 0, "kind": "bitflip",
                  "detail": {"corruption": {"changed": True, "target": "x"}}}]}
    fell_back = checksum_detection(GOLD, record([FIRST, [ev("resume", 1, step=10, fingerprint=S10)]], fired=fired))
    assert fell_back.passed and fell_back.evidence["cases"][0]["class"] == "fell back"
    silent = checksum_detection(GOLD, record([FIRST, [ev("resume", 1, step=20, fingerprint={"model/w": "?"})]],
                                             fired=fired))
    assert not silent.passed and silent.evidence["cases"][0]["class"] == "silent corruption"
    detected = checksum_detection(GOLD, record([FIRST, [ev("error", 1, type="CorruptCheckpointError", message="bad")]],
                                               outcomes=("rank_failed", "rank_failed"), fired=fired))
    assert detected.passed and detected.evidence["cases"][0]["class"] == "detected"


def test_hygiene_fails_on_anything_left_behind():
    assert hygiene(GOLD, record([FIRST], outcomes=("ok",), hygiene={"processes": [], "mounts": []})).passed
    left = hygiene(GOLD, record([FIRST], outcomes=("ok",), hygiene={"processes": [4242], "mounts": []}))
    assert not left.passed and "4242" in left.summary
