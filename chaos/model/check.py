"""Check: one judgement — pass, fail or not judged — and the evidence it rests on.

The one result type every judge returns, so that a report, the self-check and the results
JSON read one shape: the built-in workload's oracles (``chaos.judge.oracles``), a job
point's oracles (``chaos.judge.job``) and ``chaos certify``'s properties
(``chaos.certify.battery``). A check that lacks what it needs is ``not_judged`` and says
why in its summary; it never passes silently, and it is never counted as a failure.

    Check("durability", "fail", "resumed from step 10, but step 20 was acknowledged", {"loaded": 10})
    Check("bit_exact", report.passed, "resumed state equal to the golden run's")  # a bool: pass or fail

Results files written before one type carried certify's ``"n/a"``; it is read as
``not_judged``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RESULTS = ("pass", "fail", "not_judged")
_SPELLINGS = {True: "pass", False: "fail", "n/a": "not_judged"}  # the built-in's bool, certify's "n/a"


@dataclass
class Check:
    name: str
    result: str                 # pass | fail | not_judged (a bool or "n/a" given is read as one of them)
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None  # how long it took, where the judge measured it (certify)

    def __post_init__(self) -> None:
        if isinstance(self.result, bool) or self.result == "n/a":
            self.result = _SPELLINGS[self.result]
        if self.result not in RESULTS:
            raise ValueError(f"check {self.name!r}: result {self.result!r} is none of {', '.join(RESULTS)}")

    @property
    def failed(self) -> bool:
        return self.result == "fail"

    @property
    def passed(self) -> bool:
        """Not failed: a check not judged does not fail its scenario (its summary says why)."""
        return self.result != "fail"

    @property
    def status(self) -> str:
        """The result in ``chaos certify``'s words: pass, fail or n/a."""
        return "n/a" if self.result == "not_judged" else self.result

    def to_dict(self) -> dict[str, Any]:
        return {"result": self.result, "summary": self.summary, "evidence": self.evidence}


__all__ = ["RESULTS", "Check"]
