"""Who writes which tensor: replicated tensors once, per-rank tensors by their rank.

The checkpointer is not told which tensors are DDP replicas. Each rank hashes its
tensors (xxh3-128 over the bytes, plus dtype and shape) and the ranks exchange those
maps: a tensor identical on every rank is *replicated* and written once, by the rank
with the fewest bytes so far (largest tensors first, so shards come out balanced); any
other tensor is *per-rank* and every rank holding it writes its own copy under
``path@r<rank>``.

Sharded tensors (DTensor) arrive as *pieces* (``chaos.reference.ckptformat.dtensor``): a piece
held by one rank is that rank's to write; a piece several ranks hold (HSDP's replicate
dimension) is ``shared`` and, when its holders agree byte for byte, written once by the
least-loaded holder under its own name, like a replicated tensor. The saver refuses a
save whose holders of a piece disagree.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field


def per_rank_name(path: str, rank: int) -> str:
    return f"{path}@r{rank}"


@dataclass
class Plan:
    world_size: int
    replicated: set[str] = field(default_factory=set)
    owned: list[dict[str, str]] = field(default_factory=list)  # per rank: entry name -> path
    load: list[int] = field(default_factory=list)  # bytes each rank writes

    def entry_of(self, rank: int, path: str) -> str:
        return path if path in self.replicated else per_rank_name(path, rank)


# Digest placeholder of a replicated tensor a rank neither copied nor hashed (async
# saves with replicas=trust): it matches whatever the owner's real digest is.
TRUSTED = "trusted"


def _replicated(values: list) -> bool:
    if any(v is None for v in values) or any(v[1:] != values[0][1:] for v in values):
        return False
    digests = {v[0] for v in values if v[0] != TRUSTED}
    return len(digests) == 1


def make_plan(metas: Sequence[dict[str, list]], shared: Collection[str] = ()) -> Plan:
    """``metas[r]`` maps tensor path -> ``[digest, nbytes, dtype, shape]`` for rank ``r``.

    Paths in ``shared`` (DTensor pieces) held by several ranks with equal bytes are written
    once by one of their holders.
    """
    world = len(metas)
    plan = Plan(world_size=world, owned=[{} for _ in range(world)], load=[0] * world)
    paths = sorted(set().union(*metas)) if metas else []
    replicated: list[str] = []
    holders: dict[str, list[int]] = {}
    for path in paths:
        values = [m.get(path) for m in metas]
        if _replicated(values):
            replicated.append(path)
            continue
        held = [r for r, v in enumerate(values) if v is not None]
        if path in shared and len(held) > 1 and _replicated([values[r] for r in held]):
            replicated.append(path)
            holders[path] = held
            continue
        for r, v in enumerate(values):
            if v is not None:
                plan.owned[r][per_rank_name(path, r)] = path
                plan.load[r] += int(v[1])
    for path in sorted(replicated, key=lambda p: (-int(metas[holders.get(p, [0])[0]][p][1]), p)):
        nbytes = int(metas[holders.get(path, [0])[0]][path][1])
        r = min(holders.get(path, range(world)), key=lambda i: (plan.load[i], i))
        plan.owned[r][path] = path
        plan.load[r] += nbytes
        plan.replicated.add(path)
    return plan
