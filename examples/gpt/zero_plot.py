#!/usr/bin/env python3
"""zero-plot: the curves of one or more zero-gpt runs, from their metrics.jsonl, as PNG files.

    zero-plot runs/tiny/metrics.jsonl runs/tiny-stage3/metrics.jsonl -o plots/

writes, with every run overlaid under its name:
    loss_steps.png    training and validation loss against optimizer steps
    loss_tokens.png   the same against tokens trained
    throughput.png    tokens/s and TFLOPs per device against steps
    memory.png        model state per rank and peak RSS against steps

A run's name is the "name" of its start record (the run directory's name) unless --name gives
one. A resumed run appends to the same file; where a step was logged twice (resumed from an
earlier checkpoint), the later record counts.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)


def read_run(path):
    """The train and eval records of one metrics.jsonl, by step, and the run's name."""
    name, train, evals = None, {}, {}
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [(number, line.strip()) for number, line in enumerate(f, 1) if line.strip()]
    for i, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            # A record cut short: the last line of a killed run, or one a full disk cut and a
            # resume ended before appending (said once). Anything else is damage.
            if not line.startswith('{"type":'):
                sys.exit(f"zero-plot: {path}:{number}: not JSON ({e})")
            if i + 1 < len(lines):
                print(f"zero-plot: {path}:{number}: skipped a record cut short", file=sys.stderr)
            continue
        kind = record.get("type")
        if kind == "start" and name is None:
            name = record.get("name")
        elif kind == "train":
            train[record["step"]] = record
        elif kind == "eval":
            evals[record["step"]] = record
    if not train and not evals:
        sys.exit(f"zero-plot: {path} holds no train or eval records; is it a zero-gpt metrics.jsonl?")
    default = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    return {"name": name or default, "train": [train[s] for s in sorted(train)],
            "eval": [evals[s] for s in sorted(evals)]}


def series(records, x, y):
    """(xs, ys) of the records that have both keys with a value (JSON null is a gap)."""
    pairs = [(r[x], r[y]) for r in records if r.get(x) is not None and r.get(y) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def figure(size):
    width, height = size
    return plt.figure(figsize=(width / 100, height / 100), dpi=100)


FAILED = []  # the plots that could not be written (a full or read-only disk)


def save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    try:
        fig.savefig(path, dpi=100)  # no bbox "tight": the image keeps exactly the asked size
        print(path)
    except OSError as e:
        print(f"zero-plot: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        FAILED.append(path)
    finally:
        plt.close(fig)


def plot_loss(runs, x, label, size, out_dir, name):
    fig = figure(size)
    ax = fig.add_subplot(1, 1, 1)
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        xs, ys = series(run["train"], x, "loss")
        ax.plot(xs, ys, color=colour, alpha=0.6, label=f"{run['name']} train")
        xs, ys = series(run["eval"], x, "val_loss")
        if xs:
            ax.plot(xs, ys, color=colour, marker="o", linestyle="--", label=f"{run['name']} val")
    ax.set_xlabel(label)
    ax.set_ylabel("loss (nats/token)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save(fig, out_dir, name)


def plot_panels(runs, panels, size, out_dir, name):
    """One panel per (key, y label, scale) against steps, runs overlaid."""
    fig = figure(size)
    for p, (key, ylabel, scale) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, p + 1)
        for i, run in enumerate(runs):
            xs, ys = series(run["train"], "step", key)
            ax.plot(xs, [v * scale for v in ys], color=f"C{i % 10}", label=run["name"])
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if p == 0:
            ax.legend()
    ax.set_xlabel("step")
    fig.tight_layout()
    save(fig, out_dir, name)


def main():
    parser = argparse.ArgumentParser(description="Plot zero-gpt metrics.jsonl files as PNGs.")
    parser.add_argument("metrics", nargs="+", help="metrics.jsonl files, one per run")
    parser.add_argument("-o", "--out", default=".", help="directory for the PNGs (default: .)")
    parser.add_argument("--name", action="append", default=[],
                        help="a run's name in the legend, once per file in order")
    parser.add_argument("--size", default="1000x600", help="image size in pixels, WxH")
    args = parser.parse_args()
    try:
        size = tuple(int(v) for v in args.size.lower().split("x"))
        if len(size) != 2 or min(size) < 100:
            raise ValueError
    except ValueError:
        parser.error(f"--size {args.size}: expected WIDTHxHEIGHT in pixels, each >= 100")
    if len(args.name) > len(args.metrics):
        parser.error(f"{len(args.name)} --name for {len(args.metrics)} files")

    runs = [read_run(p) for p in args.metrics]
    for run, name in zip(runs, args.name):
        run["name"] = name
    os.makedirs(args.out, exist_ok=True)
    plot_loss(runs, "step", "step", size, args.out, "loss_steps.png")
    plot_loss(runs, "tokens", "tokens trained", size, args.out, "loss_tokens.png")
    plot_panels(runs, [("tokens_per_s", "tokens/s", 1.0),
                       ("tflops_per_device", "TFLOPs / device", 1.0)],
                size, args.out, "throughput.png")
    mib = 1.0 / (1024 * 1024)
    plot_panels(runs, [("model_state_bytes", "model state / rank (MiB)", mib),
                       ("peak_rss_bytes", "peak RSS (MiB)", mib)],
                size, args.out, "memory.png")
    if FAILED:
        sys.exit(f"zero-plot: {len(FAILED)} of 4 plots not written (see above)")


if __name__ == "__main__":
    main()
