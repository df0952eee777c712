#!/usr/bin/env python3
"""What docs/mutants.md says of each file's last mutation run, against git.

Its "Last runs" table names, for each file tools/mutants.sh mutates, the commit at which the
file was run (or `never`) and whether the file is `current` (unchanged since) or `stale`
(changed since, or never run). `--check` (make test) fails where the history contradicts the
table, either way; `--stale` lists the files whose code changed after their last run; `--last
FILE` prints a file's commit (or `never`).
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "mutants.md"
ROW = re.compile(r"^\| `(?P<file>[^`]+)` \| (?:`(?P<commit>[0-9a-f]{7,40})`|never) \| (?P<state>current|stale) \|")


def rows():
    text = DOC.read_text()
    start = text.index("## Last runs")
    table = [ROW.match(line) for line in text[start:].splitlines()]
    found = [m.groupdict() for m in table if m]
    if not found:
        sys.exit("mutants_record: no rows in docs/mutants.md's Last runs table")
    return found


def changed_since(path, commit):
    """Whether `path` differs from its version at `commit` (a file new since then does)."""
    if commit is None or not (ROOT / path).exists():
        return True
    known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    if known.returncode != 0:
        sys.exit(f"mutants_record: {path}: commit {commit} is not in this repository's history")
    diff = subprocess.run(["git", "diff", "--quiet", commit, "--", path], cwd=ROOT)
    return diff.returncode != 0


def mutated_files():
    """The files tools/mutants.sh mutates (its tests_of table)."""
    script = (ROOT / "tools" / "mutants.sh").read_text()
    return set(re.findall(r"\[((?:src|server|crates)/[^\]]+\.rs)\]=", script))


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "--stale"
    if mode not in ("--check", "--stale", "--last") or (mode == "--last") != (len(sys.argv) == 3):
        sys.exit("usage: mutants_record.py [--check | --stale | --last FILE]")
    wrong = []
    table = rows()
    if mode == "--last":
        found = [row for row in table if row["file"] == sys.argv[2]]
        if not found:
            sys.exit(f"mutants_record: {sys.argv[2]} is not in docs/mutants.md's Last runs table")
        print(found[0]["commit"] or "never")
        return
    listed = {row["file"] for row in table}
    for missing in sorted(mutated_files() - listed):
        wrong.append(f"{missing}: mutated by tools/mutants.sh, not in the table")
    for extra in sorted(listed - mutated_files()):
        wrong.append(f"{extra}: in the table, not mutated by tools/mutants.sh")
    for row in table:
        changed = changed_since(row["file"], row["commit"])
        if mode == "--stale" and changed:
            print(f"{row['file']} (last run: {row['commit'] or 'never'})")
        if changed and row["state"] == "current":
            wrong.append(f"{row['file']}: changed since {row['commit'] or 'ever'}, the table says current")
        if not changed and row["state"] == "stale":
            wrong.append(f"{row['file']}: unchanged since {row['commit']}, the table says stale")
    if mode == "--check" and wrong:
        print("docs/mutants.md's Last runs table is not what git says:", file=sys.stderr)
        for line in wrong:
            print(f"  {line}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
