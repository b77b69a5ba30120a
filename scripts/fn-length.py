#!/usr/bin/env python3
"""Lists the longest Rust functions and fails when one exceeds the limit.

    scripts/fn-length.py [--max 120] [--top 10] [PATH ...]     default PATH: src

A function's length is counted from the line of its `fn` keyword to the line of its closing
brace, tests included. Strings, chars and comments are blanked before braces are matched, so a
brace inside a literal cannot shift the count. Closures are part of the function that holds them;
a nested `fn` is counted on its own and also inside its parent.
"""
import argparse
import pathlib
import re
import sys


def blank(src: str) -> str:
    """Returns src with comments, strings and char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(src)

    def keep_newlines(s):
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_newlines(src[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', src[i:i + 12])) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            close = '"' + m.group(1)
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(keep_newlines(src[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(keep_newlines(src[i:j + 1]))
            i = j + 1
        elif c == "'":
            if i + 1 < n and src[i + 1] == "\\":
                j = src.find("'", i + 2)
                j = n if j < 0 else j + 1
            elif i + 2 < n and src[i + 2] == "'":
                j = i + 3
            else:
                j = i + 1  # a lifetime
            out.append(keep_newlines(src[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def functions(path: pathlib.Path):
    text = blank(path.read_text())
    line_of = []
    line = 1
    for ch in text:
        line_of.append(line)
        if ch == "\n":
            line += 1
    for m in FN.finditer(text):
        i, paren = m.end(), 0
        while i < len(text):
            ch = text[i]
            if ch in "([":
                paren += 1
            elif ch in ")]":
                paren -= 1
            elif paren == 0 and ch in ";{":
                break
            i += 1
        if i >= len(text) or text[i] == ";":
            continue  # a declaration without a body
        depth, j = 0, i
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        start, end = line_of[m.start()], line_of[min(j, len(text) - 1)]
        yield end - start + 1, f"{path}:{start}", m.group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="*", default=["src"])
    ap.add_argument("--max", type=int, default=120)
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    found = []
    for p in a.paths:
        root = pathlib.Path(p)
        files = [root] if root.is_file() else sorted(root.rglob("*.rs"))
        for f in files:
            found.extend(functions(f))
    found.sort(reverse=True)
    for length, where, name in found[: a.top]:
        print(f"{length:5d}  {name}  {where}")
    over = [f for f in found if f[0] > a.max]
    if over:
        print(f"fn-length: {len(over)} function(s) longer than {a.max} lines", file=sys.stderr)
        sys.exit(1)
    print(f"fn-length: {len(found)} functions, none longer than {a.max} lines")


if __name__ == "__main__":
    main()
