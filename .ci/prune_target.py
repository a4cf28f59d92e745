#!/usr/bin/env python3
"""Keep a persistent Cargo target dir from filling the disk.

Usage: python3 .ci/prune_target.py TARGET_DIR [--keep N] [--dry-run]

A warm target dir that many checkouts and commits have built into keeps every old build of
the workspace's own crates: each test binary is ~0.5 GB in a debug build, and one commit's
build adds a dozen of them. A disk that fills up fails the suite in odd places (S3 uploads
to the test SeaweedFS fail with INTERNAL_FAILURE once its volumes go read-only).

For the workspace's crates only (sources outside Cargo's registry and git checkouts), this
keeps the newest N builds (default 2) of each (profile, crate, root source file) and deletes
the outputs of older ones, using the dep-info (.d) files Cargo writes beside them. It also
deletes incremental-compilation caches of the same crates but the newest N per unit.
Dependencies from crates.io are never touched, so nothing but a relink or a rebuild of a
workspace crate can follow from a deletion. Prints what it freed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections import defaultdict
from pathlib import Path

CARGO_HOME = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")).resolve()


def dep_info(path: Path) -> tuple[list[Path], Path | None]:
    """The outputs a dep-info file names and the first source of the first rule."""
    outputs: list[Path] = []
    root: Path | None = None
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return outputs, root
    for line in text.splitlines():
        if not line or line.startswith((" ", "\t", "#")) or ": " not in line and not line.endswith(":"):
            continue
        target, _, deps = line.partition(":")
        target_path = Path(target.strip())
        if target_path.parent == path.parent:
            outputs.append(target_path)
            if root is None and deps.strip():
                root = Path(deps.split()[0])
    return outputs, root


def is_workspace_source(root: Path) -> bool:
    try:
        root.resolve().relative_to(CARGO_HOME)
        return False
    except ValueError:
        return True


def size_of(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size if path.exists() else 0
    except OSError:
        return 0


def remove(path: Path, dry_run: bool) -> int:
    size = size_of(path)
    if dry_run or size == 0 and not path.exists():
        return size
    try:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError as e:
        print(f"prune_target: cannot delete {path}: {e}", file=sys.stderr)
        return 0
    return size


def prune_profile(profile: Path, keep: int, dry_run: bool) -> int:
    freed = 0
    deps = profile / "deps"
    groups: dict[tuple[str, str, str], list[tuple[float, Path, list[Path]]]] = defaultdict(list)
    units: dict[str, int] = defaultdict(int)
    if deps.is_dir():
        for d in deps.glob("*.d"):
            outputs, root = dep_info(d)
            if root is None or not is_workspace_source(root):
                continue
            crate = d.stem.rsplit("-", 1)[0]
            # A library, its test harness and a `cargo check`/clippy build share crate and
            # root but are different units: the kinds of output tell them apart.
            kind = ",".join(sorted({o.suffix or "bin" for o in outputs}))
            try:
                mtime = d.stat().st_mtime
            except OSError:
                continue
            units[crate] += 1 if (crate, str(root), kind) not in groups else 0
            groups[(crate, str(root), kind)].append((mtime, d, outputs))
    for builds in groups.values():
        builds.sort(key=lambda b: b[0], reverse=True)
        for _, d, outputs in builds[keep:]:
            for out in outputs:
                freed += remove(out, dry_run)
            freed += remove(d, dry_run)
    incremental = profile / "incremental"
    if incremental.is_dir():
        by_crate: dict[str, list[tuple[float, Path]]] = defaultdict(list)
        for entry in incremental.iterdir():
            crate = entry.name.rsplit("-", 1)[0]
            if crate in units:
                try:
                    by_crate[crate].append((entry.stat().st_mtime, entry))
                except OSError:
                    continue
        for entries in by_crate.values():
            entries.sort(key=lambda e: e[0], reverse=True)
            # One incremental cache per unit; their names do not say which unit they are.
            for _, entry in entries[keep * units[crate]:]:
                freed += remove(entry, dry_run)
    return freed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target_dir", type=Path)
    parser.add_argument("--keep", type=int, default=2, help="builds kept per unit (default 2)")
    parser.add_argument("--dry-run", action="store_true", help="only say what would be freed")
    args = parser.parse_args()
    if args.keep < 1:
        parser.error("--keep must be at least 1")
    if not args.target_dir.is_dir():
        return 0
    freed = 0
    for profile in sorted(p for p in args.target_dir.iterdir() if (p / "deps").is_dir()):
        freed += prune_profile(profile, args.keep, args.dry_run)
    verb = "would free" if args.dry_run else "freed"
    print(f"prune_target: {verb} {freed / 2**30:.1f} GiB of old workspace builds in {args.target_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
