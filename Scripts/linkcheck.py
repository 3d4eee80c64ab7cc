#!/usr/bin/env python3
"""A TCP probe of a network link: its round-trip time and, when asked, its bulk goodput.

The links.* benchmark lines (Benchmarks/Sources/TetherBenchmarks/LinkBenchmarks.swift) run it on
each emulated link before measuring through it (the link alone, without Tether); it works on any
link between two hosts or network namespaces:

    linkcheck.py serve HOST PORT
        listens on HOST:PORT, prints "listening" once it does, serves one probe, then exits.
    linkcheck.py probe HOST PORT [--pings N] [--bulk-seconds S]
        N round trips of one byte each (TCP_NODELAY), printed as "rtt_ms MIN MEDIAN MAX"; then,
        with S > 0, the server sends incompressible bytes for S seconds (server -> client, as a
        catch-up flows from the server) and the client prints
        "goodput_mbit WHOLE STEADY BYTES SECONDS": TCP payload Mbit/s over the whole transfer
        (from the request, slow start included) and over its second half.

Standard library only. The best a link of R Mbit/s can give is about R x 1448/1500 (IP, TCP and
timestamp option headers of a 1500-byte packet).
"""
from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time


def serve(host: str, port: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(1)
    listener.settimeout(60)
    print("listening", flush=True)
    conn, _ = listener.accept()
    conn.settimeout(120)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    chunk = os.urandom(1 << 16)
    while True:
        command = conn.recv(1)
        if not command or command == b"q":
            break
        if command == b"p":
            conn.sendall(b"p")
        elif command == b"b":
            header = b""
            while len(header) < 8:
                part = conn.recv(8 - len(header))
                if not part:
                    return
                header += part
            (seconds,) = struct.unpack("!d", header)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                conn.sendall(chunk)
            conn.shutdown(socket.SHUT_WR)
    conn.close()
    listener.close()


def probe(host: str, port: int, pings: int, bulk_seconds: float) -> None:
    conn = socket.create_connection((host, port), timeout=30)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(pings):
        start = time.monotonic()
        conn.sendall(b"p")
        if conn.recv(1) != b"p":
            sys.exit("linkcheck: the server closed the connection during the round trips")
        rtts.append((time.monotonic() - start) * 1000)
    if rtts:
        rtts.sort()
        print(f"rtt_ms {rtts[0]:.3f} {rtts[len(rtts) // 2]:.3f} {rtts[-1]:.3f}", flush=True)
    if bulk_seconds > 0:
        conn.settimeout(bulk_seconds + 60)
        requested = time.monotonic()
        conn.sendall(b"b" + struct.pack("!d", bulk_seconds))
        marks = []  # (time, bytes so far) after each read
        total = 0
        while True:
            data = conn.recv(1 << 18)
            if not data:
                break
            total += len(data)
            marks.append((time.monotonic(), total))
        if not marks:
            sys.exit("linkcheck: no bytes received in the bulk transfer")
        last_time = marks[-1][0]
        whole = total * 8 / (last_time - requested) / 1e6
        middle = requested + (last_time - requested) / 2
        half = next((mark for mark in marks if mark[0] >= middle), marks[0])
        steady = (total - half[1]) * 8 / max(1e-9, last_time - half[0]) / 1e6
        print(f"goodput_mbit {whole:.3f} {steady:.3f} {total} {last_time - requested:.3f}", flush=True)
    conn.sendall(b"q")
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="TCP probe of a link: round trips and bulk goodput")
    sub = parser.add_subparsers(dest="mode", required=True)
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("host")
    serve_parser.add_argument("port", type=int)
    probe_parser = sub.add_parser("probe")
    probe_parser.add_argument("host")
    probe_parser.add_argument("port", type=int)
    probe_parser.add_argument("--pings", type=int, default=5)
    probe_parser.add_argument("--bulk-seconds", type=float, default=0)
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.host, args.port)
    else:
        probe(args.host, args.port, args.pings, args.bulk_seconds)


if __name__ == "__main__":
    main()
