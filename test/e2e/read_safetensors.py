#!/usr/bin/env python3
"""Independent reader for safetensors files written by `zero-ckpt export` (standard library only).

Checks the container (header length, JSON header, 8-byte alignment, dtypes, shapes, tensors
stored back to back in data_offsets order with no gap and nothing after the last one) and
compares every value with the expected fp32 bit patterns the C++ test saved:

    read_safetensors.py model.safetensors expected.json --dtype fp32|bf16

expected.json maps each parameter name to {"shape": [...], "bits": [uint32 fp32 patterns]}.
For bf16 the expected value is the fp32 pattern rounded to nearest even, computed here.
"""
import argparse
import json
import struct
import sys

ITEM_SIZE = {"F32": 4, "BF16": 2, "F16": 2}


def fail(msg):
    print("read_safetensors: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def bf16_bits(f32_bits):
    if (f32_bits & 0x7FFFFFFF) > 0x7F800000:  # NaN stays a quiet NaN
        return ((f32_bits >> 16) | 0x40) & 0xFFFF
    rounding = 0x7FFF + ((f32_bits >> 16) & 1)
    return ((f32_bits + rounding) >> 16) & 0xFFFF


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        fail("duplicate keys in the JSON header")
    return dict(pairs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("expected")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], required=True)
    args = ap.parse_args()

    with open(args.file, "rb") as f:
        data = f.read()
    if len(data) < 8:
        fail("file shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n % 8 != 0:
        fail("header length %d is not a multiple of 8" % n)
    if 8 + n > len(data):
        fail("header length %d runs past the end of the file (%d bytes)" % (n, len(data)))
    raw = data[8:8 + n]
    text = raw.rstrip(b" ")
    if not (text.startswith(b"{") and text.endswith(b"}")):
        fail("header is not a JSON object padded with spaces")
    header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    meta = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        fail("__metadata__ values must be strings")
    body = data[8 + n:]

    want_dtype = "F32" if args.dtype == "fp32" else "BF16"
    # Back to back, in data_offsets order, covering the whole body.
    spans = sorted((t["data_offsets"][0], t["data_offsets"][1], name) for name, t in header.items())
    at = 0
    for begin, end, name in spans:
        if begin != at:
            fail("tensor %s starts at %d, expected %d (gap or overlap)" % (name, begin, at))
        if end < begin:
            fail("tensor %s has end < begin" % name)
        at = end
    if at != len(body):
        fail("tensors end at %d but the data section has %d bytes" % (at, len(body)))

    with open(args.expected) as f:
        expected = json.load(f)
    if set(expected) != set(header):
        fail("tensor names differ: missing %s, unexpected %s"
             % (sorted(set(expected) - set(header)), sorted(set(header) - set(expected))))
    order = [name for _, _, name in spans]
    exp_order = list(expected)
    if order != exp_order:
        fail("tensors are not stored in layout order: %s vs %s" % (order, exp_order))

    checked = 0
    for name, t in header.items():
        if set(t) != {"dtype", "shape", "data_offsets"}:
            fail("tensor %s has fields %s" % (name, sorted(t)))
        if t["dtype"] != want_dtype:
            fail("tensor %s has dtype %s, expected %s" % (name, t["dtype"], want_dtype))
        e = expected[name]
        if t["shape"] != e["shape"]:
            fail("tensor %s has shape %s, expected %s" % (name, t["shape"], e["shape"]))
        count = 1
        for d in t["shape"]:
            count *= d
        begin, end = t["data_offsets"]
        if end - begin != count * ITEM_SIZE[t["dtype"]]:
            fail("tensor %s holds %d bytes for %d elements" % (name, end - begin, count))
        blob = body[begin:end]
        if t["dtype"] == "F32":
            got = struct.unpack("<%dI" % count, blob)
            want = e["bits"]
        else:
            got = struct.unpack("<%dH" % count, blob)
            want = [bf16_bits(b) for b in e["bits"]]
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                fail("tensor %s element %d: bits 0x%x, expected 0x%x" % (name, i, g, w))
        checked += count
    print("read_safetensors: OK: %d tensors, %d values (%s), metadata %s" % (len(header), checked, want_dtype, meta))


if __name__ == "__main__":
    main()
