#!/usr/bin/env python3
"""Checks that every relative link in the project's Markdown resolves.

    scripts/check-links.py              README.md and every docs/**/*.md
    scripts/check-links.py FILE...      only these files

A link resolves when its file (or directory) exists, relative to the linking file, and, when
it names an anchor (`file.md#heading` or `#heading`), the target Markdown file has a heading
with that GitHub-style anchor or an explicit `<a id|name="...">`. External links (with a
scheme, such as https:) are not fetched. Links inside code spans and fenced code blocks are
ignored. Exits 1 and names each broken link (file:line) when any does not resolve.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and [text](target "title"); text may span lines, may not nest brackets.
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def strip_code(text: str) -> list[str]:
    """The file's lines with fenced blocks blanked and code spans removed (line count kept)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    joined = CODE_SPAN.sub(lambda m: "\n" * m.group(0).count("\n"), "\n".join(out))
    return joined.split("\n")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, markup and punctuation dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path, cache: dict[Path, set[str]]) -> set[str]:
    if path not in cache:
        found: set[str] = set()
        seen: dict[str, int] = {}
        fenced = False
        for line in path.read_text(encoding="utf-8").split("\n"):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            found.update(HTML_ANCHOR.findall(line))
            m = HEADING.match(line)
            if m:
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def links(path: Path) -> list[tuple[int, str]]:
    lines = strip_code(path.read_text(encoding="utf-8"))
    text = "\n".join(lines)
    result = []
    for regex in (INLINE_LINK, REFERENCE_DEF):
        for m in regex.finditer(text):
            line_no = text.count("\n", 0, m.start(1)) + 1
            result.append((line_no, m.group(1)))
    return sorted(result)


def rel(path: Path) -> str:
    return os.path.relpath(path, ROOT)


def check(path: Path, cache: dict[Path, set[str]]) -> list[str]:
    errors = []
    for line_no, target in links(path):
        if SCHEME.match(target):
            continue
        where = f"{rel(path)}:{line_no}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            errors.append(f"{where}: no such file {rel(dest)}")
            continue
        if anchor and dest.suffix == ".md":
            if anchor not in anchors(dest, cache):
                errors.append(f"{where}: no heading or anchor '#{anchor}' in {rel(dest)}")
    return errors


def main(argv: list[str]) -> int:
    if argv:
        files = [Path(a).resolve() for a in argv]
    else:
        files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    cache: dict[Path, set[str]] = {}
    errors, count = [], 0
    for f in files:
        count += len(links(f))
        errors += check(f, cache)
    for e in errors:
        print(e)
    if errors:
        print(f"check-links: {len(errors)} broken of {count} links in {len(files)} files")
        return 1
    print(f"ok: {count} links in {len(files)} files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
