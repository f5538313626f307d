#!/usr/bin/env python3
"""Rewrites a Trellis delta from the old form into the compact form, written from docs/PROTOCOL.md
§3 ("Delta form") alone, on PyPI's `cbor2`: an encoder independent of the Swift one.

Usage: scripts/compact_delta.py OLD-FORM-FILE COMPACT-FILE

It made the `-compact` seeds of Fuzz/FuzzDocumentState/Corpus from their old-form neighbours;
`StateDeltaTests.theCompactFormIsWhatAnIndependentEncoderWrites` checks that Trellis writes exactly
those bytes for the same deltas.
"""
import sys

import cbor2


def difference(r, t):
    """A time as its difference below the reference time r."""
    d = r - t
    if d < 0:
        raise ValueError(f"time {t} is above the reference {r}")
    return (d >> 16) << 1 if d & 0xFFFF == 0 else (d << 1) | 1


def rows(r, items):
    """[[i, time, ...], ...] with each time (and each restart's `seen` list) written against r."""
    return [[row[0], difference(r, row[1])] + [rows(r, x) if j == 3 else x for j, x in enumerate(row) if j >= 2]
            for row in items]


def field(r, f):
    return {k: ({kk: field(r, vv) for kk, vv in v.items()} if k == "m" else rows(r, v)) for k, v in f.items()}


def compact(old_bytes):
    old = cbor2.loads(old_bytes)
    state = old["d"]
    r = max([t for _, t in state.get("w", [])] + [t for _, t in state.get("r", [])])
    sites = state["s"]
    base = sorted([sites.index(site), difference(r, t)] for site, t in old["b"])
    new = {"s": sites}
    for key in ("a", "r", "w"):
        if key in state:
            new[key] = rows(r, state[key])
    if "m" in state:
        new["m"] = {k: field(r, v) for k, v in state["m"].items()}
    # `a` is left out when it equals `w`, and written (even empty) otherwise.
    if state.get("a", []) == state.get("w", []):
        new.pop("a", None)
    else:
        new.setdefault("a", [])
    return cbor2.dumps([r, base, new, old["h"]], canonical=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out = compact(open(sys.argv[1], "rb").read())
    open(sys.argv[2], "wb").write(out)
    print(f"{sys.argv[2]}: {len(out)} bytes")
