#!/usr/bin/env python3
"""gpu_plan.py: what gpu_verify.sh builds and which sanitizer runs it makes.

    gpu_plan.py TESTS_JSON BUILD_DIR OUT_DIR [--ctest-regex R] [--san-set S] [--no-sanitizer]

TESTS_JSON is `ctest -L gpu --show-only=json-v1` of the configured (not yet built) tree. Writes
into OUT_DIR:
  targets.txt    the programs to build, one a line: those the selected tests run (every gpu
                 test but the sanitizer entries, or those matching --ctest-regex) and those the
                 chosen sanitizer runs instrument;
  san_ctest.txt  ctest's sanitizer entries (<test>_memcheck, <test>_racecheck) to run;
  san_extra.txt  the runs outside ctest, NAME=TOOL:PROGRAM[:CATCH_FILTER], in the order to run:
                 initcheck and synccheck of test_cuda_kernels' kernels, memcheck of the
                 MPI-staged communicator (test_cuda_comm), initcheck of each test_gpt_* program.

A GPU test added to test/gpu is built without editing the kit: before the build ctest's list
gives no command for a test whose program does not exist yet, so the programs come from the
add_test lines of the generated CTestTestfile.cmake files: each path under the build tree in a
test's command (not mpiexec, not run_sanitizer.sh) is a program, its file name the target's.

The sanitizer set (--san-set): "short" is our own kernels, the runs whose program is
test_cuda_kernels, test_cuda_quantize, test_gpt_attention or test_gpt_kernels, under every tool;
"full" is every run, the short set's first; anything else is a regular expression (re.search)
on the run names.
"""
import argparse
import json
import os
import re
import sys

SHORT = re.compile(r"^test_(cuda_kernels|cuda_quantize|gpt_attention|gpt_kernels)_")
SANITIZER_ENTRY = re.compile(r"_(memcheck|racecheck)$")
# add_test(<name> <command...>) as CMake writes them: bracket ([=[...]=]) or quoted arguments.
ARG = re.compile(r'\[(=*)\[(.*?)\]\1\]|"((?:[^"\\]|\\.)*)"|([^\s()]+)')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tests_json")
    ap.add_argument("build_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--ctest-regex", default="")
    ap.add_argument("--san-set", default="short")
    ap.add_argument("--no-sanitizer", action="store_true")
    a = ap.parse_args()
    build = os.path.realpath(a.build_dir) + os.sep
    try:
        with open(a.tests_json, encoding="utf-8") as f:
            tests = json.load(f).get("tests", [])
    except (OSError, ValueError) as e:
        sys.exit(f"gpu_plan: the ctest test list is unreadable: {e}")

    commands = {}
    for root, _, files in os.walk(build):
        if "CTestTestfile.cmake" in files:
            with open(os.path.join(root, "CTestTestfile.cmake"), errors="replace") as f:
                for line in f:
                    if line.startswith("add_test("):
                        words = [m.group(2) if m.group(2) is not None else m.group(3) if m.group(3) is not None
                                 else m.group(4) for m in ARG.finditer(line[len("add_test("):])]
                        if words:
                            commands[words[0]] = words[1:]

    def programs(t):
        out = []
        for w in (t.get("command") or []) + commands.get(t.get("name"), []):
            p = os.path.realpath(w) if os.path.isabs(w) else ""
            if p.startswith(build) and p not in out:
                out.append(p)
        return out

    path_of = {}  # program name -> path
    for t in tests:
        for p in programs(t):
            path_of.setdefault(os.path.basename(p), p)

    if a.san_set == "short":
        chosen = SHORT.search
    elif a.san_set == "full":
        chosen = lambda name: True  # noqa: E731
    else:
        try:
            chosen = re.compile(a.san_set).search
        except re.error as e:
            sys.exit(f"gpu_plan: SAN_SET is no regular expression: {e}")

    def short_first(names):
        return [n for n in names if SHORT.search(n)] + [n for n in names if not SHORT.search(n)]

    san_ctest, extra = [], []
    if not a.no_sanitizer:
        san_ctest = short_first([t["name"] for t in tests if SANITIZER_ENTRY.search(t["name"]) and chosen(t["name"])])
        runs = []  # (name, tool, program, filter)
        if "test_cuda_kernels" in path_of:
            runs += [("test_cuda_kernels_initcheck", "initcheck", "test_cuda_kernels", "[kernels]"),
                     ("test_cuda_kernels_synccheck", "synccheck", "test_cuda_kernels", "[kernels]")]
        if "test_cuda_comm" in path_of:
            runs.append(("test_cuda_comm_memcheck", "memcheck", "test_cuda_comm", ""))
        # The GPT kernels: reads of device memory that no kernel or copy wrote (tile padding).
        runs += [(f"{p}_initcheck", "initcheck", p, "") for p in sorted(path_of) if p.startswith("test_gpt_")]
        by_name = {r[0]: r for r in runs}
        for n in short_first([r[0] for r in runs if chosen(r[0])]):
            name, tool, prog, filt = by_name[n]
            extra.append(f"{name}={tool}:{path_of[prog]}" + (f":{filt}" if filt else ""))

    want = re.compile(a.ctest_regex).search if a.ctest_regex else (lambda name: True)
    targets = []
    for t in tests:
        n = t["name"]
        if (not SANITIZER_ENTRY.search(n) and want(n)) or n in san_ctest:
            targets += [os.path.basename(p) for p in programs(t)]
    targets += [e.split("=", 1)[1].split(":")[1] for e in extra]
    targets = list(dict.fromkeys(os.path.basename(t) for t in targets))

    os.makedirs(a.out_dir, exist_ok=True)
    for name, lines in (("targets.txt", targets), ("san_ctest.txt", san_ctest), ("san_extra.txt", extra)):
        with open(os.path.join(a.out_dir, name), "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    if a.no_sanitizer:
        sanitizer = "no sanitizer runs"
    else:
        sanitizer = (f"sanitizer set '{a.san_set}': {len(san_ctest)} ctest entries ({' '.join(san_ctest) or 'none'}), "
                     f"{len(extra)} runs outside ctest ({' '.join(e.split('=', 1)[0] for e in extra) or 'none'})")
    print(f"gpu_plan: {len(targets)} programs to build; {sanitizer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
