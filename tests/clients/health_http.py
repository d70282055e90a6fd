#!/usr/bin/env python3
"""An HTTP health endpoint for hostmesh's health-check tests.

  health_http.py ADDRESS PORT STATUS_FILE LOG_FILE

Answers every GET with the status code in STATUS_FILE (200 when missing)
and appends "<client address> <path> <Host header>" per request to
LOG_FILE, so a test sees where checks came from and what they asked.
"""
import http.server
import socket
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            with open(self.server.status_file) as f:
                status = int(f.read().strip() or "200")
        except FileNotFoundError:
            status = 200
        with open(self.server.log_file, "a") as f:
            f.write(f"{self.client_address[0]} {self.path} {self.headers.get('Host', '')}\n")
        body = b"ok\n" if status < 400 else b"failing\n"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET


def main():
    address, port, status_file, log_file = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    server = Server((address, port), Handler)
    server.status_file, server.log_file = status_file, log_file
    print("listening", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
