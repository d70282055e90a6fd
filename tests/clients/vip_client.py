#!/usr/bin/env python3
"""A host-networked client of a VIP, for hostmesh's integration tests.

The tests start it inside their own network namespace and cgroup, so the
connect-time programs see it like any process on the host. Every mode prints
one JSON object on stdout.

  requests PROTO HOST PORT COUNT   COUNT requests, each on a new socket:
      {"answers": {"b1": 10, ...}, "peers": ["10.96.0.10:80"], "errors": []}
  requests-from SOURCE PROTO HOST PORT COUNT   the same, each socket bound
      to SOURCE first
  from-port SOURCE SPORT PROTO HOST PORT   one request on a socket bound to
      SOURCE:SPORT: {"answer": "b1"} or {"error": "..."}
  loop PROTO HOST PORT INTERVAL SECONDS   a request every INTERVAL for SECONDS:
      {"ok": 80, "failures": ["12.3: timed out", ...]}
  watch PROTO HOST PORT INTERVAL SECONDS   like loop, one line per request:
      {"t": <CLOCK_MONOTONIC seconds>, "answer": "b1"} or {"t": ..., "error": "..."}
  refused PROTO HOST PORT   one connect(): {"error": "ECONNREFUSED", "seconds": 0.001}
  hold HOST PORT   one TCP connection; a request now and one per line on stdin:
      prints {"answer": "b1"} per request, or {"error": "ECONNRESET"} and ends
  hold-udp HOST PORT connected|unconnected   one UDP socket (one flow), a
      request now and one per line on stdin: {"answer": "b1"} or
      {"error": "ECONNABORTED"} per request
"""
import errno
import json
import socket
import sys
import time

TIMEOUT = 2.0


def family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def peer_text(addr):
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def request(proto, host, port, source=None, sport=0):
    """One request on a new socket (bound to source and sport, if given);
    returns (answer, peer)."""
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    with socket.socket(family(host), kind) as s:
        s.settimeout(TIMEOUT)
        if source:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((source, sport))
        if proto == "tcp":
            s.connect((host, port))
            peer = s.getpeername()
            s.sendall(b"hello\n")
            data = s.recv(64)
        else:
            s.sendto(b"hello\n", (host, port))
            data, peer = s.recvfrom(64)
        return data.decode().strip(), peer_text(peer)


def requests(proto, host, port, count, source=None):
    answers, peers, errors = {}, set(), []
    for _ in range(count):
        try:
            answer, peer = request(proto, host, port, source)
            answers[answer] = answers.get(answer, 0) + 1
            peers.add(peer)
        except OSError as e:
            errors.append(str(e))
    return {"answers": answers, "peers": sorted(peers), "errors": errors}


def loop(proto, host, port, interval, seconds):
    ok, failures = 0, []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t = time.monotonic()
        try:
            request(proto, host, port)
            ok += 1
        except OSError as e:
            failures.append(f"{t - start:.2f}: {e}")
        time.sleep(max(0.0, interval - (time.monotonic() - t)))
    return {"ok": ok, "failures": failures}


def watch(proto, host, port, interval, seconds):
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        t = time.monotonic()
        try:
            answer, _ = request(proto, host, port)
            print(json.dumps({"t": t, "answer": answer}), flush=True)
        except OSError as e:
            print(json.dumps({"t": t, "error": str(e)}), flush=True)
        time.sleep(max(0.0, interval - (time.monotonic() - t)))


def refused(proto, host, port):
    kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
    start = time.monotonic()
    with socket.socket(family(host), kind) as s:
        s.settimeout(5.0)
        try:
            s.connect((host, port))
            if proto == "udp":
                # A connected UDP socket learns of refusal on its next send/recv.
                s.send(b"hello\n")
                s.recv(64)
            error = "connected"
        except OSError as e:
            error = errno.errorcode.get(e.errno, str(e)) if e.errno else str(e)
    return {"error": error, "seconds": time.monotonic() - start}


def hold(host, port):
    with socket.socket(family(host), socket.SOCK_STREAM) as s:
        s.settimeout(TIMEOUT)
        s.connect((host, port))
        while True:
            try:
                s.sendall(b"hello\n")
                data = s.recv(64)
                out = {"answer": data.decode().strip()} if data else {"error": "closed"}
            except OSError as e:
                out = {"error": errno.errorcode.get(e.errno, str(e)) if e.errno else str(e)}
            print(json.dumps(out), flush=True)
            if "error" in out or not sys.stdin.readline():
                return


def hold_udp(host, port, how):
    with socket.socket(family(host), socket.SOCK_DGRAM) as s:
        s.settimeout(TIMEOUT)
        if how == "connected":
            s.connect((host, port))
        while True:
            try:
                if how == "connected":
                    s.send(b"hello\n")
                    data = s.recv(64)
                else:
                    s.sendto(b"hello\n", (host, port))
                    data, _ = s.recvfrom(64)
                out = {"answer": data.decode().strip()}
            except OSError as e:
                out = {"error": errno.errorcode.get(e.errno, str(e)) if e.errno else str(e)}
            print(json.dumps(out), flush=True)
            if not sys.stdin.readline():
                return


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "requests":
        out = requests(args[0], args[1], int(args[2]), int(args[3]))
    elif mode == "requests-from":
        out = requests(args[1], args[2], int(args[3]), int(args[4]), args[0])
    elif mode == "from-port":
        try:
            out = {"answer": request(args[2], args[3], int(args[4]), args[0], int(args[1]))[0]}
        except OSError as e:
            out = {"error": str(e)}
    elif mode == "loop":
        out = loop(args[0], args[1], int(args[2]), float(args[3]), float(args[4]))
    elif mode == "refused":
        out = refused(args[0], args[1], int(args[2]))
    elif mode == "hold":
        return hold(args[0], int(args[1]))
    elif mode == "hold-udp":
        return hold_udp(args[0], int(args[1]), args[2])
    elif mode == "watch":
        return watch(args[0], args[1], int(args[2]), float(args[3]), float(args[4]))
    else:
        sys.exit(f"unknown mode {mode}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
