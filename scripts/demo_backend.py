#!/usr/bin/env python3
"""A demo backend: answers every TCP or UDP request with its name.

  demo_backend.py NAME ADDRESS TCP_PORT UDP_PORT
"""
import socket
import sys
import threading


def family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def serve_tcp(name, addr, port):
    srv = socket.socket(family(addr), socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        with conn:
            if conn.recv(512):
                conn.sendall(f"{name}\n".encode())


def serve_udp(name, addr, port):
    srv = socket.socket(family(addr), socket.SOCK_DGRAM)
    srv.bind((addr, port))
    while True:
        _, peer = srv.recvfrom(512)
        srv.sendto(f"{name}\n".encode(), peer)


def main():
    name, addr, tcp_port, udp_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    threading.Thread(target=serve_udp, args=(name, addr, udp_port), daemon=True).start()
    serve_tcp(name, addr, tcp_port)


if __name__ == "__main__":
    main()
