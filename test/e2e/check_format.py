#!/usr/bin/env python3
"""Every C++/CUDA source of the project is formatted as .clang-format says.

Runs clang-format 14 (the version Debian 12 ships; another version formats some constructs
differently, so it is not accepted) in --dry-run --Werror mode over libzero/, offload/,
examples/, bench/ and test/. Exit 77 (ctest: skipped) where clang-format-14 is not installed
(cmake/install-deps.sh installs it); 1 listing the files to reformat, with the command that
does it.

usage: check_format.py <source root>
"""
import pathlib
import shutil
import subprocess
import sys

FOLDERS = ("libzero", "offload", "examples", "bench", "test")
SUFFIXES = (".cpp", ".hpp", ".cu", ".cuh", ".h")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1]).resolve()
    tool = shutil.which("clang-format-14")
    if not tool:
        print("clang-format-14 not found (sudo apt-get install clang-format-14): format not checked")
        return 77
    files = sorted(str(f.relative_to(root)) for d in FOLDERS for f in (root / d).rglob("*")
                   if f.suffix in SUFFIXES and f.is_file())
    if not files:
        print(f"no sources under {root}")
        return 1
    unformatted = []
    for i in range(0, len(files), 64):
        batch = files[i:i + 64]
        run = subprocess.run([tool, "--dry-run", "--Werror", "--style=file", *batch], cwd=root,
                             capture_output=True, text=True)
        if run.returncode != 0:
            bad = sorted({line.split(":", 1)[0] for line in run.stderr.splitlines()
                          if ": error:" in line})
            unformatted += bad or batch
    if unformatted:
        for f in unformatted:
            print(f"not formatted: {f}")
        print(f"{len(unformatted)} of {len(files)} files differ from .clang-format; run "
              f"clang-format-14 -i on them (from {root})")
        return 1
    print(f"{len(files)} files formatted as .clang-format says")
    return 0


if __name__ == "__main__":
    sys.exit(main())
