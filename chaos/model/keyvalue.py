"""``KEY=VALUE`` options as the command line spells them, and back.

``--workload``, ``--ckpt-opt`` and a fault's ``key=value`` parameters are read by
:func:`key_values` / ``_parse_value``; a replay command writes them with
:func:`format_value`, its inverse. Called by ``chaos.plan.scenario``, ``chaos.cli`` and the
built-in workload's job entry (``python -m chaos.target.workload``), which must read the
same options the same way.
"""

from __future__ import annotations

import re
from typing import Any

from chaos.errors import ConfigError

_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _parse_value(text: str) -> Any:
    """``key=value`` text to a value: int, float (also ``1e-05``), bool, else the string.

    ``format_value`` is its inverse, so a replay command rebuilds exactly the values it
    was made from.
    """
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if _NUMBER.fullmatch(text):
        return float(text)
    if text in ("true", "false"):
        return text == "true"
    return text


def key_values(items: list[str], what: str) -> dict[str, Any]:
    """``KEY=VALUE`` options (``--workload``, ``--ckpt-opt``) as a dict, values read by
    ``_parse_value``; called by ``chaos.cli.main`` and the commands that take such options."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"malformed {what} {item!r}: expected key=value")
        out[key] = _parse_value(raw)
    return out


def format_value(value: Any) -> str:
    """A value as ``_parse_value`` reads it back (``repr`` of a float round-trips exactly)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    return str(value)
