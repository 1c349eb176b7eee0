#!/usr/bin/env python3
"""The layering that docs/architecture.md states, checked against the #include lines.

docs/architecture.md holds, between <!-- layering:begin --> and <!-- layering:end -->, one line
per folder: `folder: the folders it may include` (a lower layer never includes a higher one).
Folders are those of libzero/src, plus `offload` (offload/) and `zero` (the public headers,
libzero/include/zero, which every folder may include and which include no private header).
The check fails when a source file includes a folder its line does not allow, when a folder of
libzero/src has no line, or when the stated graph has a cycle.

usage: check_layering.py <source root>
"""
import pathlib
import re
import sys

SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/', re.M)


def stated_layers(doc: pathlib.Path) -> dict[str, set[str]]:
    text = doc.read_text()
    m = re.search(r"<!-- layering:begin -->(.*?)<!-- layering:end -->", text, re.S)
    if not m:
        sys.exit(f"{doc}: no <!-- layering:begin --> ... <!-- layering:end --> block")
    layers: dict[str, set[str]] = {}
    for line in m.group(1).splitlines():
        line = line.strip().strip("`").strip()
        if not line or line.startswith(("```", "#", "|")) or ":" not in line:
            continue
        name, deps = line.split(":", 1)
        name = name.strip("-* ").strip()
        layers[name] = {d.strip() for d in deps.replace(",", " ").split() if d.strip() and d.strip() != "-"}
    if not layers:
        sys.exit(f"{doc}: the layering block names no folder")
    return layers


def find_cycle(layers: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for d in sorted(layers.get(n, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        state[n] = 2
        path.pop()
        return None

    for n in sorted(layers):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def folder_files(root: pathlib.Path) -> dict[str, list[pathlib.Path]]:
    folders: dict[str, list[pathlib.Path]] = {}
    src = root / "libzero" / "src"
    for d in sorted(p for p in src.iterdir() if p.is_dir()):
        folders[d.name] = [f for f in d.rglob("*") if f.suffix in SOURCES]
    folders["offload"] = [f for f in (root / "offload").rglob("*") if f.suffix in SOURCES]
    folders["zero"] = [f for f in (root / "libzero" / "include" / "zero").rglob("*") if f.suffix in SOURCES]
    return folders


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1])
    layers = stated_layers(root / "docs" / "architecture.md")
    folders = folder_files(root)
    problems: list[str] = []
    for name in folders:
        if name not in layers:
            problems.append(f"folder {name}/ has no line in docs/architecture.md's layering block")
    for name in layers:
        if name not in folders:
            problems.append(f"the layering block names {name}, which is not a folder of libzero/src")
        for d in layers[name]:
            if d not in folders:
                problems.append(f"the layering block lets {name} include {d}, which is not a folder")
    cycle = find_cycle(layers)
    if cycle:
        problems.append("the stated layering has a cycle: " + " -> ".join(cycle))
    known = set(folders)
    for name, files in folders.items():
        allowed = layers.get(name, set()) | {name, "zero"}
        for f in files:
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m or m.group(1) not in known:
                    continue
                target = m.group(1)
                if target not in allowed:
                    problems.append(f"{f.relative_to(root)}:{n}: {name}/ includes {target}/ "
                                    f"(allowed: {', '.join(sorted(allowed))})")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} layering problem(s); fix the include or, where the design changed, "
              "the block in docs/architecture.md")
        return 1
    print(f"layering holds: {sum(len(f) for f in folders.values())} files in {len(folders)} folders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
