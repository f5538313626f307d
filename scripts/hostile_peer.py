#!/usr/bin/env python3
"""A hostile mesh member for limit tests: it holds the mesh key and follows docs/PROTOCOL.md just
far enough to be admitted, then tries to make a node spend memory, threads or CPU.

Built on scripts/sync_peer.py's pieces (PyPI's `noiseprotocol` and `cbor2`). It dials
127.0.0.1:PORT, completes the Noise_XXpsk0 handshake and sends `hello` on each session, then does
one of:

  --unfinished N   opens N sessions; on each announces a message of --size bytes (default
                   64 MiB - 1, the largest) and sends all of it but the last byte, then holds the
                   sessions open (answering nothing: a `pong` would finish the message);
  --sessions N     opens N sessions (each after the handshake and `hello`) and holds them open;
  --subs N         opens one session and sends N subscriptions on --collection whose query compares
                   two fields (`a == b && n != K`, K from 0 to N - 1): SQLite cannot use an index
                   for them, so every scan evaluates them row by row; it acknowledges nothing;
  --raw N          opens N connections and sends 4096 random bytes on each, without a handshake;
  --udp N          sends N random datagrams (1 to 1500 bytes) to 127.255.255.255:--udp-port, the
                   loopback broadcast address a node's discovery listens on in its loopback scope
                   (nothing leaves the host).

--hello-version V makes `hello` announce protocol version V (default 5). Any --psk works for --raw
and --udp; another mesh key than the node's makes every handshake fail (counted as refused).

It holds for --hold SECONDS (default 30), then closes every socket abruptly (no authenticated
close).

Standard output: one JSON object per line: {"event": "ready", "sessions": K} once everything is in
place (K sessions open; some may have been refused by the node's limits), then {"event": "closed"}.
Sessions the node refused or closed are counted in {"event": "refused", "count": R, "reason": ...}
lines as they are found.

Exit codes: 0 done, 2 bad arguments, 3 a missing module (run scripts/test.sh).
"""

import argparse
import json
import os
import select
import socket
import struct
import sys
import time

from noise_peer import run_handshake, write_frame

try:
    import cbor2
except ImportError:
    sys.stderr.write("hostile_peer: the Python module 'cbor2' is not installed; run scripts/test.sh\n")
    sys.exit(3)

from link_peer import MAX_PLAINTEXT, REKEY_MARKER
from noise.connection import Keypair, NoiseConnection

PROTOCOL_VERSION = 5
PROLOGUE = b"trellis/3"


def emit(event, **fields):
    fields["event"] = event
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Member:
    """One admitted session: handshake done, `hello` sent."""

    def __init__(self, port, psk, answer_pings=True, version=PROTOCOL_VERSION):
        self.answer_pings = answer_pings
        conn = NoiseConnection.from_name(b"Noise_XXpsk0_25519_ChaChaPoly_SHA256")
        conn.set_psks(psk=psk)
        conn.set_prologue(PROLOGUE)
        conn.set_as_initiator()
        conn.set_keypair_from_private_bytes(Keypair.STATIC, os.urandom(32))
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.io = self.sock.makefile("rwb")
        conn.start_handshake()
        static_public = conn.noise_protocol.handshake_state.s.public_bytes
        run_handshake(conn, True, self.io, self.io)
        self.conn = conn
        self.inbound = bytearray()
        self.pending = bytearray()
        self.sock.settimeout(None)
        site = int.from_bytes(os.urandom(8), "big") & ((1 << 63) - 1) or 1
        self.send({"t": "hello", "v": version, "key": static_public, "site": site,
                   "epoch": os.urandom(16), "n": int.from_bytes(os.urandom(4), "big")})

    def send_plain(self, data):
        for start in range(0, len(data), MAX_PLAINTEXT):
            write_frame(self.io, self.conn.encrypt(data[start:start + MAX_PLAINTEXT]))

    def send(self, message):
        data = cbor2.dumps(message, canonical=True)
        self.send_plain(struct.pack(">I", len(data)) + data)

    def drain(self):
        """Reads what arrived, answers `ping` with `pong` (so the node keeps the session) and drops
        the rest; False once the node closed the connection."""
        try:
            while select.select([self.sock], [], [], 0)[0]:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return False
                self.inbound += chunk
                while len(self.inbound) >= 2:
                    (length,) = struct.unpack(">H", self.inbound[:2])
                    if len(self.inbound) < 2 + length:
                        break
                    frame = bytes(self.inbound[2:2 + length])
                    del self.inbound[:2 + length]
                    plaintext = self.conn.decrypt(frame)
                    if not plaintext:
                        return False
                    if not self.pending and plaintext == REKEY_MARKER:
                        self.conn.rekey_inbound_cipher()
                        continue
                    self.pending += plaintext
                    while len(self.pending) >= 4:
                        (size,) = struct.unpack(">I", self.pending[:4])
                        if len(self.pending) < 4 + size:
                            break
                        message = cbor2.loads(bytes(self.pending[4:4 + size]))
                        del self.pending[:4 + size]
                        if self.answer_pings and isinstance(message, dict) and message.get("t") == "ping":
                            self.send({"t": "pong", "n": message["n"]})
        except (OSError, ValueError, cbor2.CBORDecodeError):
            return False
        return True

    def abort(self):
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.sock.close()
        except OSError:
            pass


def main(argv):
    parser = argparse.ArgumentParser(description="A hostile Trellis mesh member (limit tests).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--psk", required=True, help="mesh key, 64 hex digits")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--unfinished", type=int)
    mode.add_argument("--sessions", type=int)
    mode.add_argument("--subs", type=int)
    mode.add_argument("--raw", type=int)
    mode.add_argument("--udp", type=int)
    parser.add_argument("--udp-port", type=int)
    parser.add_argument("--hello-version", type=int, default=PROTOCOL_VERSION)
    parser.add_argument("--size", type=int, default=64 * 1024 * 1024 - 1)
    parser.add_argument("--collection", default="cars")
    parser.add_argument("--hold", type=float, default=30)
    args = parser.parse_args(argv)
    psk = bytes.fromhex(args.psk)
    if len(psk) != 32:
        parser.error("--psk must be 32 bytes (64 hex digits)")

    members = []
    refused = 0

    def admit():
        nonlocal refused
        try:
            member = Member(args.port, psk, answer_pings=args.unfinished is None, version=args.hello_version)
            members.append(member)
            return member
        except Exception as error:  # refused at the handshake, or closed: counted, not fatal
            refused += 1
            emit("refused", count=refused, reason="%s: %s" % (type(error).__name__, error))
            return None

    if args.unfinished is not None:
        size = args.size
        for _ in range(args.unfinished):
            member = admit()
            if member is None:
                continue
            try:
                member.send_plain(struct.pack(">I", size) + b"\x00" * (size - 1))
            except OSError as error:
                refused += 1
                emit("refused", count=refused, reason="sending: %s" % error)
    elif args.sessions is not None:
        for _ in range(args.sessions):
            admit()
    elif args.raw is not None:
        for _ in range(args.raw):
            try:
                sock = socket.create_connection(("127.0.0.1", args.port), timeout=5)
                sock.sendall(os.urandom(4096))
                sock.close()
            except OSError as error:
                refused += 1
                emit("refused", count=refused, reason="raw: %s" % error)
    elif args.udp is not None:
        if args.udp_port is None:
            parser.error("--udp needs --udp-port")
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        for _ in range(args.udp):
            sock.sendto(os.urandom(1 + os.urandom(2)[0] * 5 % 1500), ("127.255.255.255", args.udp_port))
        sock.close()
    else:
        member = admit()
        if member is not None:
            subs = [{"c": args.collection, "q": "a == b && n != %d" % k, "a": {}, "since": 0, "hops": 0, "gen": 0}
                    for k in range(args.subs)]
            member.send({"t": "subs", "v": 1, "subs": subs})

    live = [m for m in members if m.drain()]
    emit("ready", sessions=len(live))
    deadline = time.monotonic() + args.hold
    while time.monotonic() < deadline:
        time.sleep(0.5)
        for member in members:
            member.drain()
    for member in members:
        member.abort()
    emit("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
