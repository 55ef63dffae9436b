"""A small internet for the egress tests, run inside a network namespace the test
made: HTTP and HTTPS servers on two addresses, a UDP echo, and a DNS server that
names them. Every address is a documentation address, reachable only through the
test's own veth. Prints "ready" when every server listens."""

import os
import socket
import ssl
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ALLOWED, DENIED, DNS = sys.argv[1], sys.argv[2], sys.argv[3]
CERTS = sys.argv[4]
NAMES = {
    "allowed.test": ALLOWED,
    "denied.test": DENIED,
    "private.test": "10.200.0.1",
    "metadata.test": "169.254.169.254",
    # The host's own: its loopback, and its end of the test's veth (HOST_SIDE).
    "loopback.test": "127.0.0.1",
    "host.test": "198.51.100.1",
}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path.startswith("/bytes/"):
            n = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            chunk = b"x" * 65536
            while n > 0:
                self.wfile.write(chunk[: min(n, len(chunk))])
                n -= min(n, len(chunk))
            return
        body = f"hello from {self.server.server_address[0]} for {self.headers.get('Host')}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def http(addr, port, tls_name=None):
    srv = ThreadingHTTPServer((addr, port), Handler)
    srv.daemon_threads = True
    if tls_name:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(CERTS, f"{tls_name}.crt"), os.path.join(CERTS, f"{tls_name}.key"))
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()


def name_of(packet, at):
    labels = []
    while True:
        n = packet[at]
        at += 1
        if n == 0:
            return ".".join(labels).lower(), at
        labels.append(packet[at : at + n].decode())
        at += n


def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((DNS, 53))
    while True:
        q, peer = s.recvfrom(1500)
        try:
            name, end = name_of(q, 12)
            qtype = struct.unpack("!H", q[end : end + 2])[0]
        except Exception:
            continue
        question = q[12 : end + 4]
        addr = NAMES.get(name)
        answers = b""
        rcode = 0
        if addr is None:
            rcode = 3
        elif qtype == 1:
            answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton(addr)
        flags = 0x8180 | rcode
        header = q[:2] + struct.pack("!HHHHH", flags, 1, 1 if answers else 0, 0, 0)
        s.sendto(header + question + answers, peer)


def udp_echo(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, port))
    while True:
        data, peer = s.recvfrom(1500)
        s.sendto(data, peer)


for addr, name in [(ALLOWED, "allowed.test"), (DENIED, "denied.test")]:
    http(addr, 80)
    http(addr, 443, name)
    http(addr, 8080)
threading.Thread(target=dns, daemon=True).start()
threading.Thread(target=udp_echo, args=(ALLOWED, 9999), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
