#!/usr/bin/env python3
"""An independent Trellis link peer for interop tests, built on PyPI's `noiseprotocol` (module `noise`).

It dials 127.0.0.1:PORT, runs the Noise_XXpsk0_25519_ChaChaPoly_SHA256 handshake as initiator
(prologue `trellis/3`, empty payloads), then speaks the link's transport stream as
docs/PROTOCOL.md section 1 describes it:

  - every Noise message on TCP is a 2-byte big-endian length and the message;
  - transport plaintexts form one byte stream of application messages, each a 4-byte big-endian
    length and that many bytes; a message may span transport messages and several may share one;
  - a transport message whose whole plaintext is FF FF FF FF, where a message's length prefix would
    start, is the rekey marker: its sender rekeys its sending cipher after it, its receiver its
    receiving cipher; this peer sends one at the first message boundary after every N transport
    messages (`--rekey-interval`, default 1048576);
  - an empty transport plaintext is the authenticated close.

It answers every application message with the same bytes reversed, and exits 0 after the
authenticated close, printing "authenticated close received" to stderr.

Exit codes: 0 success, 2 bad arguments, 3 the `noise` module is missing (run scripts/test.sh, or
`python3 -m pip install noiseprotocol`), 4 a protocol error, 5 the stream ended without the close.
"""

import argparse
import os
import socket
import struct
import sys

# The framing helpers (2-byte lengths over a byte stream), the handshake loop and the `noise`
# import check are noise_peer.py's, which sits beside this script.
from noise_peer import PeerClosed, read_frame, run_handshake, write_frame

from noise.connection import Keypair, NoiseConnection

MAX_PLAINTEXT = 65519
REKEY_MARKER = b"\xff\xff\xff\xff"


class Link:
    def __init__(self, stream, conn, interval):
        self.io, self.conn, self.interval = stream, conn, interval
        self.sent = 0
        self.rekeys_sent = 0
        self.rekeys_received = 0
        self.pending = bytearray()

    def send_message(self, message):
        # A message boundary: rekey first when due.
        if self.sent >= self.interval:
            write_frame(self.io, self.conn.encrypt(REKEY_MARKER))
            self.conn.rekey_outbound_cipher()
            self.sent = 0
            self.rekeys_sent += 1
        data = struct.pack(">I", len(message)) + message
        for start in range(0, len(data), MAX_PLAINTEXT):
            write_frame(self.io, self.conn.encrypt(data[start:start + MAX_PLAINTEXT]))
            self.sent += 1

    def run(self):
        while True:
            plaintext = self.conn.decrypt(bytes(read_frame(self.io)))
            if not plaintext:
                return
            # Between messages (nothing pending), FF FF FF FF alone is the rekey marker.
            if not self.pending and plaintext == REKEY_MARKER:
                self.conn.rekey_inbound_cipher()
                self.rekeys_received += 1
                continue
            self.pending += plaintext
            while len(self.pending) >= 4:
                (length,) = struct.unpack(">I", self.pending[:4])
                if len(self.pending) < 4 + length:
                    break
                message = bytes(self.pending[4:4 + length])
                del self.pending[:4 + length]
                self.send_message(message[::-1])


def main(argv):
    parser = argparse.ArgumentParser(description="Trellis link peer (interop tests).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--psk", required=True, help="mesh key, 64 hex digits")
    parser.add_argument("--rekey-interval", type=int, default=1 << 20)
    args = parser.parse_args(argv)
    psk = bytes.fromhex(args.psk)
    if len(psk) != 32 or args.rekey_interval < 1:
        parser.error("--psk must be 32 bytes and --rekey-interval at least 1")

    conn = NoiseConnection.from_name(b"Noise_XXpsk0_25519_ChaChaPoly_SHA256")
    conn.set_psks(psk=psk)
    conn.set_prologue(b"trellis/3")
    conn.set_as_initiator()
    conn.set_keypair_from_private_bytes(Keypair.STATIC, os.urandom(32))
    sock = socket.create_connection(("127.0.0.1", args.port), timeout=60)
    stream = sock.makefile("rwb")
    try:
        conn.start_handshake()
        run_handshake(conn, True, stream, stream)
        link = Link(stream, conn, args.rekey_interval)
        link.run()
    except PeerClosed as error:
        sys.stderr.write("link_peer: the stream ended without the authenticated close: %s\n" % error)
        return 5
    except Exception as error:  # any Noise or socket failure is reported, not a traceback
        sys.stderr.write("link_peer: protocol error: %s: %s\n" % (type(error).__name__, error))
        return 4
    finally:
        stream.close()
        sock.close()
    sys.stderr.write("rekeys sent %d received %d\n" % (link.rekeys_sent, link.rekeys_received))
    sys.stderr.write("authenticated close received\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
