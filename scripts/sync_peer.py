#!/usr/bin/env python3
"""An independent Trellis sync peer, written from docs/PROTOCOL.md alone, on PyPI's `noiseprotocol`
(module `noise`) and `cbor2`.

It dials 127.0.0.1:PORT as the Noise initiator (Noise_XXpsk0_25519_ChaChaPoly_SHA256, prologue
`trellis/3`, the mesh key as psk, a fresh static key, empty handshake payloads), then:

  1. sends `hello` (protocol version 5, its static public key, a random site ID and epoch, a nonce)
     and reads the node's;
  2. sends `subs` asking for the whole collection `--collection` (`q` "true", from `since` 0);
  3. decodes every document of every `batch` (the single-write form and the whole state, encoding
     version 2) and answers each batch with `ack`;
  4. once the node has sent a batch with `left: 0` (its initial sync is complete) and has asked this
     peer for a subscription on that collection, writes one new document `{"_id": --write-id,
     "from": "sync_peer"}` in the single-write form, stamped with an HLC stamp of its own site, as a
     `batch` for that subscription, and waits for the node's `ack` of it;
  5. sends the authenticated close and exits 0.

With --caught-up its `hello` also says `f: 1` (caught-up batches, docs/PROTOCOL.md §2 step 5): a
`batch` without `upTo` from the node counts as its `left: 0` and is not acknowledged; and, its own
log being empty, it answers each subscription the node asks of it (from `since` 0) with a
caught-up batch, which the node must not acknowledge.

It answers `ping` with `pong`, ignores `presence`, follows rekey markers (link_peer.py's framing).

Standard output: one JSON object per line: {"event": "hello", ...} for the node's hello, {"event":
"document", "collection", "id", "form": "single"|"state", "exists", "doc"} for each document
received ("doc" is the JSON the document shows, `_id` included; byte strings as {"$bytes": base64}),
{"event": "batch", ...} per batch, {"event": "caughtUp", ...} per caught-up batch either way,
{"event": "wrote", ...} for the write, {"event": "ack", ...} for the node's ack of it and
{"event": "other-ack", ...} for any other ack, {"event": "suberr"|"error", ...} when the node
sends one.

Arguments: --port PORT, the mesh key as --mesh-key FILE (64 hex digits or 32 raw bytes, as
`trellis keygen` and `MeshKey.write(to:)` store it) or --psk HEX, --collection NAME, --write-id ID,
--timeout SECONDS (default 30), --caught-up.

Exit codes: 0 success, 2 bad arguments, 3 the `noise` or `cbor2` module is missing (run
scripts/test.sh, or `python3 -m pip install noiseprotocol cbor2`), 4 a protocol error (a message
or state that does not follow docs/PROTOCOL.md), 5 the connection ended without the authenticated
close, 6 the node sent `error`, 7 the timeout passed before the write was acknowledged.
"""

import argparse
import base64
import json
import os
import socket
import struct
import sys
import time

# Noise framing, the handshake loop and the `noise` import check (exit 3) are noise_peer.py's;
# the transport byte stream with rekey markers is link_peer.py's `Link`.
from noise_peer import PeerClosed, read_frame, run_handshake, write_frame

try:
    import cbor2
except ImportError:
    sys.stderr.write(
        "sync_peer: the Python module 'cbor2' is not installed; run scripts/test.sh, which installs "
        "it, or: python3 -m pip install cbor2\n")
    sys.exit(3)

from link_peer import REKEY_MARKER, Link
from noise.connection import Keypair, NoiseConnection

PROTOCOL_VERSION = 5
PROLOGUE = b"trellis/3"
MAX_MESSAGE = 64 * 1024 * 1024
U64 = (1 << 64) - 1


class ProtocolError(Exception):
    pass


class NodeError(Exception):
    pass


class Session(Link):
    """link_peer's stream of application messages, read one CBOR message at a time."""

    def __init__(self, stream, conn):
        super().__init__(stream, conn, 1 << 20)
        self.closed = False

    def send(self, message):
        self.send_message(cbor2.dumps(message, canonical=True))

    def receive(self):
        """The next application message (a dict), or None after the authenticated close."""
        while True:
            if len(self.pending) >= 4:
                (length,) = struct.unpack(">I", self.pending[:4])
                if length > MAX_MESSAGE:
                    raise ProtocolError("message length %d above 64 MiB" % length)
                if len(self.pending) >= 4 + length:
                    data = bytes(self.pending[4:4 + length])
                    del self.pending[:4 + length]
                    message = cbor2.loads(data)
                    if not isinstance(message, dict) or not isinstance(message.get("t"), str):
                        raise ProtocolError("a message that is not a map with a text 't'")
                    return message
            plaintext = self.conn.decrypt(bytes(read_frame(self.io)))
            if not plaintext:
                self.closed = True
                return None
            if not self.pending and plaintext[:4] == REKEY_MARKER:
                if len(plaintext) != 4:
                    raise ProtocolError("a rekey marker followed by more bytes")
                self.conn.rekey_inbound_cipher()
                self.rekeys_received += 1
                continue
            self.pending += plaintext

    def close(self):
        write_frame(self.io, self.conn.encrypt(b""))


# --- JSON as Trellis writes it (PROTOCOL.md section 3, single-write form) ---------------------

def to_json_value(value):
    """A CBOR value as the JSON value a document shows (byte strings as {"$bytes": base64})."""
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, list):
        return [to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    return value


def json_text(value):
    """Compact JSON, object keys sorted by their UTF-8 bytes, only `"`, `\\` and controls escaped."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-8"))
        return "{" + ",".join(json_text(k) + ":" + json_text(v) for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value)


# --- Document states (PROTOCOL.md section 3) --------------------------------------------------

def stamp_key(time_value, site):
    """Stamps order by (time, site), both as unsigned 64-bit integers."""
    return (time_value & U64, site & U64)


def covers(context, time_value, site):
    return (site & U64) in context and context[site & U64] >= (time_value & U64)


def join(context, entries, sites):
    joined = dict(context)
    for entry in entries:
        site = sites[entry[0]] & U64
        joined[site] = max(joined.get(site, 0), entry[1] & U64)
    return joined


def decode_single(state, doc_id):
    if set(state) != {"j", "u"} or not isinstance(state["j"], str) or not isinstance(state["u"], list) \
            or len(state["u"]) != 2:
        raise ProtocolError("single-write form: expected {j: text, u: [time, site]}, got keys %s" % sorted(state))
    doc = json.loads(state["j"])
    if not isinstance(doc, dict) or doc.get("_id") != to_json_value(doc_id):
        raise ProtocolError("single-write form: JSON without the entry's _id %r" % (doc_id,))
    return doc, stamp_key(*state["u"])


def decode_whole(state, doc_id):
    allowed = {"a", "m", "r", "s", "v", "w"}
    if state.get("v") != 2 or not set(state) <= allowed or not isinstance(state.get("s"), list):
        raise ProtocolError("whole state: encoding version %r, keys %s" % (state.get("v"), sorted(state)))
    sites = state["s"]

    def index_check(entries, what):
        for entry in entries:
            if not isinstance(entry, list) or not entry or not 0 <= entry[0] < len(sites):
                raise ProtocolError("whole state: %s entry %r names no site" % (what, entry))

    for part in ("a", "r", "w"):
        index_check(state.get(part, []), part)
    removed = join({}, state.get("r", []), sites)
    latest = max([stamp_key(e[1], sites[e[0]]) for e in state.get("w", [])] or [(0, 0)])

    def counter(totals, restarts, removed_totals):
        """What a counter shows (docs/DATA-MODEL.md rule 4): the winning restart's number, plus each
        site's visible total beyond the later (by stamp) of what the restart and a remove had seen."""
        winner = max(restarts, key=lambda e: stamp_key(e[1], sites[e[0]])) if restarts else None
        sub = {}  # site -> (stamp, total)
        seen = list(removed_totals) + (winner[3] if winner is not None else [])
        for e in seen:
            site = sites[e[0]] & U64
            candidate = (stamp_key(e[1], sites[e[0]]), e[2])
            if site not in sub or candidate[0] > sub[site][0]:
                sub[site] = candidate
        base = winner[2] if winner is not None else 0
        terms = []
        for e in sorted(totals, key=lambda e: sites[e[0]] & U64):
            site = sites[e[0]] & U64
            if site in sub and stamp_key(e[1], sites[e[0]]) <= sub[site][0]:
                continue
            terms.append((e[2], sub[site][1] if site in sub else 0))
        if isinstance(base, int) and all(isinstance(t, int) and isinstance(s, int) for t, s in terms):
            value = base + sum(t - s for t, s in terms)
            if -(1 << 63) <= value < (1 << 63):
                return value
        value = float(base)
        for t, s in terms:
            value += float(t) - float(s)
        return value

    def shows(field, context, path):
        """(rank stamp, JSON value) the field shows, or None. Rank: value 2, counter 1, map 0."""
        field_allowed = {"b", "e", "h", "m", "o", "p", "t", "x"}
        if not isinstance(field, dict) or not set(field) <= field_allowed:
            raise ProtocolError("whole state: field %s has keys %s" % (path, sorted(field)))
        for part in field_allowed - {"m"}:
            index_check(field.get(part, []), "%s.%s" % (path, part))
        context = join(context, field.get("x", []), sites)
        shown = []
        values = [(stamp_key(e[1], sites[e[0]]), e[2]) for e in field.get("e", [])
                  if not covers(context, e[1], sites[e[0]])]
        if values:
            stamp, value = max(values, key=lambda sv: sv[0])
            shown.append((stamp, 2, to_json_value(value)))
        totals = [e for e in field.get("t", []) if not covers(context, e[1], sites[e[0]])]
        restarts = [e for e in field.get("b", []) if not covers(context, e[1], sites[e[0]])]
        if totals or restarts:
            shown.append((max(stamp_key(e[1], sites[e[0]]) for e in totals + restarts), 1,
                          counter(totals, restarts, field.get("o", []))))
        children = {}
        child_stamps = []
        for key, child in field.get("m", {}).items():
            result = shows(child, context, path + "." + key)
            if result is not None:
                children[key] = result[1]
                child_stamps.append(result[0])
        maps = [stamp_key(e[1], sites[e[0]]) for e in field.get("p", [])
                if not covers(context, e[1], sites[e[0]])]
        if maps or children:
            shown.append((max(maps + child_stamps), 0, children))
        if not shown:
            return None
        stamp, _, value = max(shown, key=lambda s: (s[0], s[1]))
        return stamp, value

    exists = any(not covers(removed, e[1], sites[e[0]]) for e in state.get("a", []))
    doc = {"_id": to_json_value(doc_id)}
    if exists:
        for key, field in state.get("m", {}).items():
            result = shows(field, removed, key)
            if result is not None:
                doc[key] = result[1]
    return doc, exists, latest


def decode_state(data, doc_id):
    if data[:3] == b"\xa2\x61\x6a":
        doc, stamp = decode_single(cbor2.loads(data), doc_id)
        return "single", doc, True, stamp
    state = cbor2.loads(data)
    if not isinstance(state, dict):
        raise ProtocolError("a state that is not a map")
    doc, exists, stamp = decode_whole(state, doc_id)
    return "state", doc, exists, stamp


# --- The session ------------------------------------------------------------------------------

def subscription_key(sub):
    return "%s\x1f%s\x1f%s" % (sub["c"], sub["q"], json_text(to_json_value(sub.get("a", {}))))


def emit(event, **fields):
    fields = dict(event=event, **fields)
    sys.stdout.write(json.dumps(fields, sort_keys=True) + "\n")
    sys.stdout.flush()


def run(session, args, static_public):
    site = int.from_bytes(os.urandom(8), "big") & ((1 << 63) - 1) or 1
    hello = {"t": "hello", "v": PROTOCOL_VERSION, "key": static_public, "site": site,
             "epoch": os.urandom(16), "n": int.from_bytes(os.urandom(4), "big")}
    if args.caught_up:
        hello["f"] = 1
    session.send(hello)
    session.send({"t": "subs", "v": 1, "subs": [
        {"c": args.collection, "q": "true", "a": {}, "since": 0, "hops": 0, "gen": 0}]})
    deadline = time.monotonic() + args.timeout
    clock = int(time.time() * 1000) << 16  # the HLC: millis << 16 | logical
    node_hello = None
    synced = False
    asked = {}  # key -> the node's subscription on our collection
    written = None
    while time.monotonic() < deadline:
        message = session.receive()
        if message is None:
            raise PeerClosed("authenticated close before the write was acknowledged")
        kind = message["t"]
        if kind == "hello":
            node_hello = message
            emit("hello", v=message.get("v"), key=bytes(message.get("key", b"")).hex(), site=message.get("site"))
            if message.get("v") != PROTOCOL_VERSION:
                raise ProtocolError("the node speaks protocol version %r" % message.get("v"))
        elif node_hello is None:
            raise ProtocolError("'%s' before hello" % kind)
        elif kind == "ping":
            session.send({"t": "pong", "n": message["n"]})
        elif kind == "subs":
            for sub in message.get("subs", []):
                if sub.get("c") == args.collection:
                    key = subscription_key(sub)
                    if args.caught_up and (node_hello.get("f", 0) & 1) and key not in asked:
                        # Nothing in this peer's log after any `since`: caught up, not acknowledged.
                        caught_up = {"t": "batch", "sub": key}
                        if sub.get("gen", 0):
                            caught_up["gen"] = sub["gen"]
                        session.send(caught_up)
                        emit("caughtUp", sub=key, sent=True)
                    asked[key] = sub
        elif kind == "batch" and "upTo" not in message:
            if not (args.caught_up and "docs" not in message and "left" not in message):
                raise ProtocolError("a batch without upTo: %r" % message)
            emit("caughtUp", sub=message["sub"], sent=False)
            synced = True
        elif kind == "batch":
            for entry in message["docs"]:
                form, doc, exists, stamp = decode_state(bytes(entry["s"]), entry["id"])
                clock = max(clock, stamp[0])  # the HLC adopts every stamp it sees
                emit("document", collection=entry["c"], id=to_json_value(entry["id"]), form=form,
                     exists=exists, doc=doc)
            emit("batch", sub=message["sub"], docs=len(message["docs"]), upTo=message["upTo"],
                 left=message.get("left"))
            session.send({"t": "ack", "sub": message["sub"], "upTo": message["upTo"]})
            if message.get("left") == 0:
                synced = True
        elif kind == "ack":
            if written is not None and message["sub"] == written and message["upTo"] >= 1:
                emit("ack", sub=message["sub"], upTo=message["upTo"])
                session.close()
                return 0
            emit("other-ack", sub=message["sub"], upTo=message["upTo"])
        elif kind == "suberr":
            emit("suberr", sub=message.get("sub"), code=message.get("code"), msg=message.get("msg"))
        elif kind == "error":
            emit("error", code=message.get("code"), msg=message.get("msg"))
            raise NodeError("%s: %s" % (message.get("code"), message.get("msg")))
        if written is None and synced and asked:
            key, sub = sorted(asked.items())[0]
            clock = max(clock + 1, int(time.time() * 1000) << 16)
            text = json_text({"_id": args.write_id, "from": "sync_peer"})
            state = cbor2.dumps({"j": text, "u": [clock, site]}, canonical=True)
            session.send({"t": "batch", "sub": key, "gen": sub.get("gen", 0), "upTo": 1, "left": 0,
                          "docs": [{"c": args.collection, "id": args.write_id, "s": state}]})
            written = key
            emit("wrote", sub=key, id=args.write_id, time=clock, site=site)
    return 7


def main(argv):
    parser = argparse.ArgumentParser(description="Trellis sync peer written from docs/PROTOCOL.md.")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mesh-key", help="mesh key file: 64 hex digits or 32 bytes")
    parser.add_argument("--psk", help="mesh key, 64 hex digits")
    parser.add_argument("--collection", required=True)
    parser.add_argument("--write-id", required=True)
    parser.add_argument("--timeout", type=float, default=30)
    parser.add_argument("--caught-up", action="store_true", help="say f: 1 (caught-up batches)")
    args = parser.parse_args(argv)
    if (args.mesh_key is None) == (args.psk is None):
        parser.error("give exactly one of --mesh-key and --psk")
    if args.mesh_key is not None:
        with open(args.mesh_key, "rb") as file:
            raw = file.read()
        psk = bytes.fromhex(raw.decode("ascii").strip()) if len(raw.strip()) == 64 else raw
    else:
        psk = bytes.fromhex(args.psk)
    if len(psk) != 32:
        parser.error("the mesh key must be 32 bytes (64 hex digits)")

    conn = NoiseConnection.from_name(b"Noise_XXpsk0_25519_ChaChaPoly_SHA256")
    conn.set_psks(psk=psk)
    conn.set_prologue(PROLOGUE)
    conn.set_as_initiator()
    conn.set_keypair_from_private_bytes(Keypair.STATIC, os.urandom(32))
    sock = socket.create_connection(("127.0.0.1", args.port), timeout=args.timeout)
    stream = sock.makefile("rwb")
    try:
        conn.start_handshake()
        static_public = conn.noise_protocol.handshake_state.s.public_bytes
        run_handshake(conn, True, stream, stream)
        return run(Session(stream, conn), args, static_public)
    except NodeError as error:
        sys.stderr.write("sync_peer: the node sent error: %s\n" % error)
        return 6
    except (PeerClosed, ConnectionError) as error:
        sys.stderr.write("sync_peer: the connection ended without the authenticated close: %s\n" % error)
        return 5
    except socket.timeout:
        sys.stderr.write("sync_peer: nothing arrived within %s s\n" % args.timeout)
        return 7
    except Exception as error:  # a malformed message or state, a Noise failure: reported, not a traceback
        sys.stderr.write("sync_peer: protocol error: %s: %s\n" % (type(error).__name__, error))
        return 4
    finally:
        stream.close()
        sock.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
