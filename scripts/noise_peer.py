#!/usr/bin/env python3
"""An independent Noise peer for Trellis interop tests, built on PyPI's `noiseprotocol` (module `noise`).

It runs one Noise_XXpsk0_25519_ChaChaPoly_SHA256 (or Noise_XXpsk3_... or Noise_XX_...) handshake over stdin/stdout, then
answers transport messages, so the Swift TrellisCrypto implementation can be checked against it.

Framing (both directions): every message is a 2-byte big-endian length followed by that many bytes.

Conversation:
  1. The handshake: three messages, initiator first (`--role` says which side this peer plays).
     This peer sends empty handshake payloads and ignores the ones it receives.
  2. `--rounds N` times (default 1): read one transport message, decrypt it, and send back the
     plaintext transformed by `--transform` (reverse, the default, or upper), encrypted.
     With `--rekey`, both directions are rekeyed (Noise spec rev 34, section 11.3) before every
     round after the first.
  3. Print to stderr, one per line: `handshake_hash=HEX`, `static_public=HEX`, `remote_static=HEX`,
     then exit 0.

Exit codes: 0 success, 2 bad arguments, 3 the `noise` module is not installed (run scripts/test.sh,
or `python3 -m pip install noiseprotocol`), 4 a protocol error (message on stderr), 5 the other side
closed the stream early.

Example:
  python3 scripts/noise_peer.py --role responder --psk 00..(64 hex digits) --prologue 7472656c6c6973
"""

import argparse
import os
import struct
import sys

try:
    from noise.connection import Keypair, NoiseConnection
except ImportError:
    sys.stderr.write(
        "noise_peer: the Python module 'noise' (PyPI package 'noiseprotocol') is not installed; "
        "run scripts/test.sh, which installs it, or: python3 -m pip install noiseprotocol\n")
    sys.exit(3)

MAX_MESSAGE = 65535


class PeerClosed(Exception):
    pass


def read_exact(stream, count):
    data = b""
    while len(data) < count:
        chunk = stream.read(count - len(data))
        if not chunk:
            raise PeerClosed("stream closed after %d of %d bytes" % (len(data), count))
        data += chunk
    return data


def read_frame(stream):
    (length,) = struct.unpack(">H", read_exact(stream, 2))
    return read_exact(stream, length)


def write_frame(stream, payload):
    if len(payload) > MAX_MESSAGE:
        raise ValueError("message of %d bytes exceeds %d" % (len(payload), MAX_MESSAGE))
    stream.write(struct.pack(">H", len(payload)) + bytes(payload))
    stream.flush()


def run_handshake(conn, initiator, reader, writer):
    """Exchanges handshake messages (empty payloads) until the handshake is finished."""
    writing = initiator
    while not conn.handshake_finished:
        if writing:
            write_frame(writer, conn.write_message(b""))
        else:
            conn.read_message(read_frame(reader))
        writing = not writing


def parse_args(argv):
    parser = argparse.ArgumentParser(description="Noise XX/XXpsk3/XXpsk0 peer over stdin/stdout (Trellis interop).")
    parser.add_argument("--role", choices=["initiator", "responder"], default="responder")
    parser.add_argument("--pattern", choices=["XXpsk0", "XXpsk3", "XX"], default="XXpsk3")
    parser.add_argument("--psk", default="", help="pre-shared key, 64 hex digits (required for XXpsk0 and XXpsk3)")
    parser.add_argument("--prologue", default="", help="prologue, hex")
    parser.add_argument("--static", default="", help="static X25519 private key, 64 hex digits (default: random)")
    parser.add_argument("--transform", choices=["reverse", "upper"], default="reverse")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rekey", action="store_true", help="rekey both directions before each later round")
    args = parser.parse_args(argv)
    try:
        args.psk = bytes.fromhex(args.psk)
        args.prologue = bytes.fromhex(args.prologue)
        args.static = bytes.fromhex(args.static) if args.static else os.urandom(32)
    except ValueError as error:
        parser.error("bad hex argument: %s" % error)
    if args.pattern != "XX" and len(args.psk) != 32:
        parser.error("--psk must be 32 bytes (64 hex digits) for %s, got %d bytes" % (args.pattern, len(args.psk)))
    if len(args.static) != 32:
        parser.error("--static must be 32 bytes (64 hex digits)")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def transform(data, how):
    return bytes(reversed(data)) if how == "reverse" else bytes(data).upper()


def run(args, stdin, stdout):
    conn = NoiseConnection.from_name(("Noise_%s_25519_ChaChaPoly_SHA256" % args.pattern).encode("ascii"))
    if args.pattern != "XX":
        conn.set_psks(psk=args.psk)
    conn.set_prologue(args.prologue)
    conn.set_keypair_from_private_bytes(Keypair.STATIC, args.static)
    if args.role == "initiator":
        conn.set_as_initiator()
    else:
        conn.set_as_responder()
    conn.start_handshake()
    # Keep the handshake state: the library drops it (and the remote static key) once finished.
    handshake = conn.noise_protocol.handshake_state
    static_public = handshake.s.public_bytes

    run_handshake(conn, args.role == "initiator", stdin, stdout)

    for round_index in range(args.rounds):
        if args.rekey and round_index > 0:
            conn.rekey_inbound_cipher()
            conn.rekey_outbound_cipher()
        plaintext = conn.decrypt(bytes(read_frame(stdin)))
        write_frame(stdout, conn.encrypt(transform(plaintext, args.transform)))

    sys.stderr.write("handshake_hash=%s\n" % conn.get_handshake_hash().hex())
    sys.stderr.write("static_public=%s\n" % static_public.hex())
    sys.stderr.write("remote_static=%s\n" % handshake.rs.public_bytes.hex())
    sys.stderr.flush()


def main(argv):
    args = parse_args(argv)
    try:
        run(args, sys.stdin.buffer, sys.stdout.buffer)
    except PeerClosed as error:
        sys.stderr.write("noise_peer: the other side closed the stream: %s\n" % error)
        return 5
    except Exception as error:  # any Noise or crypto failure is reported, not a traceback
        sys.stderr.write("noise_peer: protocol error: %s: %s\n" % (type(error).__name__, error))
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
