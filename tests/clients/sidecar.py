#!/usr/bin/env python3
"""A test sidecar for hostmesh's mesh redirects.

  sidecar.py NAME PORT

Listens on 127.0.0.1:PORT and [::1]:PORT, TCP and UDP. Every request is
answered with "NAME <local address>", where the local address is what the
sidecar saw: getsockname() for TCP, IP_RECVORIGDSTADDR /
IPV6_RECVORIGDSTADDR for UDP. UDP answers go out from that original
destination, port included (a socket bound to it: the VIP is local), as a
transparent sidecar must do, so the client sees the VIP:port answer.
"""
import socket
import struct
import sys
import threading

IP_RECVORIGDSTADDR = 20
IPV6_RECVORIGDSTADDR = 74
IP_FREEBIND = 15
IPV6_FREEBIND = 78


def addr_text(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve_tcp(name, family, host, port):
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    srv.bind((host, port))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=answer_tcp, args=(name, conn), daemon=True).start()


def answer_tcp(name, conn):
    with conn:
        local = conn.getsockname()
        while conn.recv(512):
            conn.sendall(f"{name} {addr_text(local[0], local[1])}\n".encode())


def serve_udp(name, family, host, port):
    srv = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET:
        srv.setsockopt(socket.IPPROTO_IP, IP_RECVORIGDSTADDR, 1)
    else:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        srv.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVORIGDSTADDR, 1)
    srv.bind((host, port))
    while True:
        _, anc, _, peer = srv.recvmsg(512, 256)
        orig = None
        for level, kind, data in anc:
            if family == socket.AF_INET and kind == IP_RECVORIGDSTADDR:
                p, ip = struct.unpack("!2xH4s8x", data[:16])
                orig = (socket.inet_ntop(socket.AF_INET, ip), p)
            elif family == socket.AF_INET6 and kind == IPV6_RECVORIGDSTADDR:
                p, _, ip = struct.unpack("!2xHI16s", data[:24])
                orig = (socket.inet_ntop(socket.AF_INET6, ip), p)
        reply = f"{name} {addr_text(*orig) if orig else '?'}\n".encode()
        if orig is None:
            srv.sendto(reply, peer)
            continue
        # Answer from the original destination, port included: a socket
        # bound to the VIP:port (the VIP is local) sends the reply.
        out = socket.socket(family, socket.SOCK_DGRAM)
        out.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # IPv6 binds only addresses on an interface, not ones a local route
        # covers: freebind lifts that (IP_FREEBIND for symmetry).
        if family == socket.AF_INET6:
            out.setsockopt(socket.IPPROTO_IPV6, IPV6_FREEBIND, 1)
        else:
            out.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
        out.bind(orig)
        out.sendto(reply, peer)
        out.close()


def main():
    name, port = sys.argv[1], int(sys.argv[2])
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        threading.Thread(target=serve_udp, args=(name, family, host, port), daemon=True).start()
        threading.Thread(target=serve_tcp, args=(name, family, host, port), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
