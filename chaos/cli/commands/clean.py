"""`chaos clean`: remove what harnesses that were killed before their own clean-up left behind.

    chaos clean              # sweep now, one line per harness cleaned up after
    chaos clean --dry-run    # say what would be removed, remove nothing
    chaos clean --list       # every claim: whose, alive or gone, what it holds

Every harness sweeps once by itself, when it makes its first scratch root
(:mod:`chaos.scratch`); this runs the same sweep on demand, e.g. in a CI job's
``always()`` step after a hard timeout. Exit status 0, 2 when the claims directory
cannot be read or is refused (not a private directory of this user: see SECURITY.md).
"""

from __future__ import annotations

import argparse

NAME = "clean"
HELP = "remove scratch roots, mounts, namespaces and processes that killed harnesses left"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")
    parser.add_argument("--list", action="store_true", help="list every claim (live, gone, other namespace) and exit")


def run(args: argparse.Namespace) -> int:
    from chaos import scratch

    try:
        if args.list:
            found = scratch.claims()
            if not found:
                print(f"no claims in {scratch.claims_dir()}")
            for c in found:
                if c.state == "untrusted":
                    print(scratch.printable(f"left alone: {c.why}"))
                    continue
                roots = ", ".join(f"{r.path}{' (keep)' if r.keep else ''}" for r in c.roots) or "no root"
                labs = f"; network labs {', '.join(c.netns)}" if c.netns else ""
                print(scratch.printable(f"pid {c.pid} [{c.state}] {' '.join(c.argv[:3])}: {roots}{labs}"))
            return 0
        done = scratch.sweep(dry_run=args.dry_run)
        for c in scratch.untrusted():
            print(scratch.printable(f"left alone: {c.why}"))
    except scratch.UnsafeClaims as exc:
        print(f"error: {exc}")
        return 2
    except OSError as exc:
        print(f"error: cannot read the claims in {scratch.claims_dir()}: {exc}")
        return 2
    acted = [d for d in done if d.acted or d.kept]
    for d in acted:
        line = d.line()
        print(line.replace("chaos: cleaned up after", "would clean up after", 1) if args.dry_run else line)
    if not acted:
        print("nothing to clean up: no harness that claimed anything ended without its own clean-up")
    return 0
