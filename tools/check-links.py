#!/usr/bin/env python3
"""Check that every relative link in the project's markdown resolves.

    python3 tools/check-links.py [FILE.md ...]

Without arguments it checks every *.md of the repository, but for hidden folders and build
outputs (target/, gpu-bundle/, measurements/cache/, node_modules/). For each link `[text](path)`, `[text](path#anchor)`,
`[text](#anchor)`, image `![alt](path)` and reference definition `[label]: path` outside fenced
code blocks and code spans, the file or folder must exist (relative to the linking file) and
an anchor must name a heading of the target markdown file, by GitHub's rules (lowercased;
characters other than letters, digits, spaces, hyphens and underscores dropped; spaces to
hyphens; a repeated heading gets -1, -2, ...) or an explicit `id`/`name` in its HTML.
Links with a scheme (http:, https:, mailto:, ...) are not checked.

Prints `file:line: link: why` for each broken link and exits 1; else prints a one-line
summary and exits 0. Standard library only; run from anywhere (paths are taken from the
repository root, the folder above this script).
"""

import os
import re
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ID = re.compile(r"""<[^>]*?\b(?:id|name)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


# Folders whose markdown is not the project's: build outputs, caches, installed packages.
SKIPPED = {"target", "node_modules", "__pycache__", "gpu-bundle", "measurements/cache"}


def default_files():
    files = []
    for folder, subfolders, names in os.walk(ROOT):
        relative = Path(folder).relative_to(ROOT)
        subfolders[:] = sorted(
            name for name in subfolders
            if not name.startswith(".") and name not in SKIPPED
            and (relative / name).as_posix() not in SKIPPED
        )
        files += [Path(folder) / name for name in sorted(names) if name.endswith(".md")]
    return files


def prose_lines(text):
    """(line number, line) for every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence = match.group(1)
                continue
            yield number, line
        elif match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence) \
                and line.strip() == match.group(1):
            fence = None


def without_code_spans(line):
    """The text with each code span's content blanked out (same length, line breaks kept)."""
    out = []
    i = 0
    while i < len(line):
        if line[i] == "`":
            run = len(line[i:]) - len(line[i:].lstrip("`"))
            ticks = line[i:i + run]
            end = line.find(ticks, i + run)
            while end != -1 and end + run < len(line) and line[end + run] == "`":
                end = line.find(ticks, end + run + 1)
            if end == -1:
                out.append(line[i:i + run])
                i += run
                continue
            # Blanked, but for line breaks: a code span may run over several lines.
            out.append(re.sub(r"[^\n]", " ", line[i:end + run]))
            i = end + run
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def heading_text(raw):
    """A heading's text as GitHub renders it, before slugging."""
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", raw)          # images: their alt text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)          # links: their text
    text = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", text)         # reference links
    text = re.sub(r"<[^>]+>", "", text)                            # inline HTML
    text = text.replace("`", "")
    # Emphasis markers are punctuation and go anyway, except underscores, which stay unless
    # they delimit emphasis (at a word's edge).
    text = re.sub(r"(?<![\w])_+|_+(?![\w])", "", text)
    return text.strip()


def slug(text):
    out = []
    for char in text.lower():
        if char in " -_":
            out.append("-" if char == " " else char)
        elif unicodedata.category(char)[0] in "LNM":
            out.append(char)
    return "".join(out)


_anchor_cache = {}


def anchors(path):
    """Every anchor a markdown file defines: its headings' slugs and its HTML ids."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    found = set()
    counts = {}

    def add_heading(raw):
        base = slug(heading_text(raw))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")

    previous = None
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        heading = ATX_HEADING.match(line)
        if heading:
            add_heading(heading.group(2) or "")
            previous = None
        elif previous and previous.strip() and SETEXT_UNDERLINE.match(line) \
                and not previous.lstrip().startswith(("|", ">", "-", "*", "+")):
            add_heading(previous.strip())
            previous = None
        else:
            previous = line
        for name in HTML_ID.findall(line):
            found.add(name)
    _anchor_cache[path] = found
    return found


def inline_links(line):
    """(column, target) for each `[text](target)` or `![alt](target)` in a line."""
    i = 0
    while True:
        start = line.find("[", i)
        if start == -1:
            return
        # The bracketed text, brackets nested.
        depth, j = 0, start
        while j < len(line):
            if line[j] == "\\":
                j += 2
                continue
            if line[j] == "[":
                depth += 1
            elif line[j] == "]":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        if j >= len(line):
            return
        if j + 1 < len(line) and line[j + 1] == "(":
            # The destination, parentheses balanced, up to an optional title.
            k, depth = j + 2, 1
            while k < len(line) and depth:
                if line[k] == "\\":
                    k += 2
                    continue
                if line[k] == "(":
                    depth += 1
                elif line[k] == ")":
                    depth -= 1
                k += 1
            inside = line[j + 2:k - 1].strip()
            if inside.startswith("<"):
                target = inside[1:inside.find(">")] if ">" in inside else inside[1:]
            else:
                target = inside.split()[0] if inside else ""
            yield start, target
            i = k
        else:
            i = start + 1


def paragraphs(text):
    """Runs of consecutive prose lines, [(line number, line)], as markdown parses code spans in:
    a paragraph's lines together (a code span may close on a later line: read line by line, the
    text after its closing backticks was taken for code and its links missed), a table row or a
    heading alone."""
    run = []
    for number, line in prose_lines(text):
        alone = line.lstrip().startswith(("|", "#"))
        if run and (not line.strip() or alone or number != run[-1][0] + 1):
            yield run
            run = []
        if alone:
            yield [(number, line)]
        elif line.strip():
            run.append((number, line))
    if run:
        yield run


def links(path):
    """(line number, target) of every link in a markdown file."""
    for paragraph in paragraphs(path.read_text(encoding="utf-8")):
        blanked = without_code_spans("\n".join(line for _, line in paragraph)).split("\n")
        for (number, _), line in zip(paragraph, blanked):
            definition = REFERENCE_DEFINITION.match(line)
            if definition:
                target = definition.group(2)
                yield number, target[1:-1] if target.startswith("<") else target
                continue
            for _, target in inline_links(line):
                yield number, target


def problem(source, target):
    """Why a link does not resolve, or None."""
    if not target:
        return "empty link"
    if SCHEME.match(target) or target.startswith("//"):
        return None
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part.split("?")[0])
    if path_part:
        resolved = (ROOT / path_part.lstrip("/")) if path_part.startswith("/") \
            else (source.parent / path_part)
        if not resolved.exists():
            return f"{path_part} does not exist"
    else:
        resolved = source
    if not anchor:
        return None
    if resolved.is_dir() or resolved.suffix.lower() not in (".md", ".markdown"):
        return None  # anchors into code and folders are GitHub's own (#L10): not checked
    if unquote(anchor) not in anchors(resolved):
        return f"no heading or id #{anchor} in {display(resolved)}"
    return None


def display(path):
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv):
    files = [Path(arg).resolve() for arg in argv] if argv else default_files()
    broken = 0
    count = 0
    for source in files:
        if not source.exists():
            print(f"{display(source)}: no such file")
            broken += 1
            continue
        for number, target in links(source):
            count += 1
            why = problem(source, target)
            if why:
                print(f"{display(source)}:{number}: {target}: {why}")
                broken += 1
    if broken:
        print(f"check-links: {broken} of {count} links in {len(files)} files do not resolve",
              file=sys.stderr)
        return 1
    print(f"check-links: {count} links in {len(files)} files, all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
