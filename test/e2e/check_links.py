#!/usr/bin/env python3
"""Checks the relative links of the repository's Markdown files.

Every Markdown file git knows (tracked, or new and not ignored) is read; each relative link must
name a file or folder that exists inside the repository, and a link with a #fragment into a
Markdown file (or within the same file) must name one of its headings, as GitHub makes their
anchors: the heading's text lower-cased, punctuation dropped, spaces turned into hyphens, and
-1, -2, ... appended to repeats. Links in code blocks and code spans are not links. Web links
(http:, https:, mailto:, ...) are not fetched.

    check_links.py [REPO_ROOT]        (default: the repository this script is in)

Prints each broken link as file:line and exits 1, or prints a count and exits 0.
"""
import os
import re
import subprocess
import sys
import unicodedata
import urllib.parse

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
# [text](target "title") and ![alt](target); the text may hold one level of brackets and span
# lines, the target may hold balanced parentheses.
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"
    r"\(\s*(<[^<>\n]*>|[^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*)"
    r"(?:\s+(?:\"[^\"\n]*\"|'[^'\n]*'|\([^()\n]*\)))?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(<[^<>\n]*>|\S+)", re.M)
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*\"([^\"]*)\"", re.I)
HTML_ANCHOR = re.compile(r"<[a-z][^>]*?\b(?:id|name)\s*=\s*\"([^\"]+)\"", re.I)
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files(root):
    """The Markdown files git tracks or would track, as paths relative to root."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "--cached", "--others", "--exclude-standard", "-z",
             "--", "*.md"], check=True, capture_output=True).stdout.decode()
        files = sorted({f for f in out.split("\0") if f})
        return [f for f in files if os.path.isfile(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []  # not a git checkout: walk the tree, leaving out build and hidden folders but .ci
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d == ".ci" or not (d.startswith(".") or d.startswith("build"))]
        files += [os.path.relpath(os.path.join(folder, n), root) for n in names if n.endswith(".md")]
    return sorted(files)


def blank(match):
    """The match's text with everything but newlines turned into spaces (offsets stay valid)."""
    return re.sub(r"[^\n]", " ", match.group(0))


def without_code(text):
    """text with fenced code blocks and code spans blanked out, line numbers kept."""
    lines = text.split("\n")
    fence = None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            lines[i] = ""
        elif fence is not None:
            if m and m.group(1).startswith(fence):
                fence = None
            lines[i] = ""
    return CODE_SPAN.sub(blank, "\n".join(lines))


def heading_text(raw):
    """A heading's text as GitHub renders it: code spans kept verbatim, markup dropped."""
    spans = []

    def keep(m):
        spans.append(m.group(2).strip())
        return "\0%d\0" % (len(spans) - 1)

    text = CODE_SPAN.sub(keep, raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)      # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)                          # inline HTML
    text = re.sub(r"(\*\*|__)(.+?)\1", r"\2", text)              # strong
    text = re.sub(r"(?<!\w)([*_])(.+?)\1(?!\w)", r"\2", text)    # emphasis
    return re.sub(r"\0(\d+)\0", lambda m: spans[int(m.group(1))], text)


def slug(text):
    """GitHub's anchor for a heading text (before repeats are numbered): lower case, only letters,
    marks, digits, connector punctuation (_), hyphens and spaces kept, spaces made hyphens."""
    kept = (c for c in text.strip().lower()
            if c in " -" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc")
    return "".join(kept).replace(" ", "-")


def anchors(text):
    """Every anchor a Markdown text defines: its headings' slugs and HTML ids."""
    found, seen = set(), {}
    lines = without_code(text).split("\n")
    originals = text.split("\n")
    for i, line in enumerate(lines):
        title = None
        m = ATX_HEADING.match(line)
        if m:
            title = originals[i].strip().lstrip("#").strip()
            title = re.sub(r"[ \t]+#+[ \t]*$", "", title)
        elif (i + 1 < len(lines) and SETEXT_UNDERLINE.match(lines[i + 1]) and line.strip()
              and not re.match(r"^ {0,3}([-*+|>]|\d+[.)])(\s|$)", line)):
            title = originals[i].strip()  # setext: a paragraph line over "===" or "---"
        if title is None:
            continue
        base = slug(heading_text(title))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else "%s-%d" % (base, n))
    found.update(HTML_ANCHOR.findall(text))
    return found


def links(text):
    """(line, target) of every link in a Markdown text, code left out."""
    clean = without_code(text)
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEF, HTML_LINK):
        for m in pattern.finditer(clean):
            target = m.group(1).strip()
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            found.append((clean.count("\n", 0, m.start(1)) + 1, target))
    return sorted(found)


def check(root):
    root = os.path.realpath(root)
    files = markdown_files(root)
    anchor_cache = {}

    def anchors_of(path):
        if path not in anchor_cache:
            with open(path, encoding="utf-8") as f:
                anchor_cache[path] = anchors(f.read())
        return anchor_cache[path]

    broken, count = [], 0
    for rel in files:
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for line, target in links(text):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue  # empty, or a web link: not fetched
            count += 1
            where, _, fragment = target.partition("#")
            where = urllib.parse.unquote(where.split("?")[0])
            fragment = urllib.parse.unquote(fragment)
            if where:
                base = root if where.startswith("/") else os.path.dirname(path)
                dest = os.path.realpath(os.path.join(base, where.lstrip("/")))
                if dest != root and not dest.startswith(root + os.sep):
                    broken.append("%s:%d: %s: outside the repository" % (rel, line, target))
                    continue
                if not os.path.exists(dest):
                    broken.append("%s:%d: %s: no such file or folder" % (rel, line, target))
                    continue
            else:
                dest = path
            if fragment and dest.endswith(".md") and os.path.isfile(dest):
                if fragment not in anchors_of(dest):
                    broken.append("%s:%d: %s: no heading with the anchor #%s in %s"
                                  % (rel, line, target, fragment, os.path.relpath(dest, root)))
    return files, count, broken


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    files, count, broken = check(root)
    if not files:
        print("check_links: no Markdown files found under %s" % root)
        return 1
    for b in broken:
        print(b)
    if broken:
        print("check_links: %d of %d relative links in %d Markdown files are broken"
              % (len(broken), count, len(files)))
        return 1
    print("check_links: %d relative links in %d Markdown files, all found" % (count, len(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
