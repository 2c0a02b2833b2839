"""The fifth security audit's attacks on the SIP port, the client-secret route and the queued
clients' buffers, re-run against release binaries side by side (docs/reliability.md, "The SIP
port and the buffers"). Each attack gets a fresh server (one reference worker, SIP on loopback
with 127.0.0.1 as the only trunk address, the shipped bounds otherwise); the server's memory
and CPU are read from /proc, its log counted, and what reached the attacker and a third party
is counted datagram by datagram. One markdown row per attack, a column per binary.

    python3 scripts/sip_surface.py LABEL=BINARY...     (scripts/sip_surface.sh builds them)

The stranger sends from 127.0.0.2, the third party listens on 127.0.0.3 (both loopback).
"""

import base64
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from surface import KEY, Server, free_port  # noqa: E402


def sip_config(sip_port, extra=""):
    return f"""[server]
bind = "127.0.0.1:PORT"
[auth]
api_keys = ["{KEY}"]
[[workers]]
name = "w"
[sip]
enabled = true
bind = "127.0.0.1:{sip_port}"
rtp_ports = [43000, 43099]
allowed_networks = ["127.0.0.1/32"]
[[sip.routes]]
number = "*"
{extra}
"""


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_bytes(srv):
    srv.log.flush()
    return os.path.getsize(srv.log.name)


def invite(via, call_id, pad=0):
    body = (
        "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
        "m=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    # Padding in Via headers, which every response copies.
    padding = "".join(f"Via: SIP/2.0/UDP 127.0.0.9:5060;branch=z9hG4bKpad{i}{'a' * 900}\r\n" for i in range(pad // 960))
    return (
        f"INVITE sip:100@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{call_id}\r\n"
        f"Max-Forwards: 70\r\nFrom: <sip:a@127.0.0.2>;tag=t{call_id}\r\nTo: <sip:100@127.0.0.1>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 INVITE\r\n{padding}Content-Type: application/sdp\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


def options(via, call_id):
    return (
        f"OPTIONS sip:100@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP {via};branch=z9hG4bK{call_id}\r\n"
        f"Max-Forwards: 70\r\nFrom: <sip:a@127.0.0.1>;tag=t\r\nTo: <sip:100@127.0.0.1>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
    ).encode()


class Counter:
    """Counts the datagrams and bytes arriving at a UDP socket, on a thread of its own."""

    def __init__(self, ip):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((ip, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.settimeout(0.2)
        self.datagrams = self.bytes = 0
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def addr(self):
        return "%s:%d" % self.sock.getsockname()

    def run(self):
        while self.running:
            try:
                data = self.sock.recv(65536)
            except OSError:
                continue
            self.datagrams += 1
            self.bytes += len(data)

    def stop(self):
        self.running = False
        self.thread.join()


def answers_options(sip_port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(2)
    s.sendto(options("%s:%d" % s.getsockname(), "probe"), ("127.0.0.1", sip_port))
    try:
        return s.recv(65536).startswith(b"SIP/2.0 200")
    except OSError:
        return False
    finally:
        s.close()


def overflow(binary):
    """One datagram with Content-Length 2^64-1 from the trunk's address, then a keepalive."""
    sip_port = free_port()
    srv = Server(binary, sip_config(sip_port))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    bad = options("%s:%d" % s.getsockname(), "overflow").replace(b"Content-Length: 0", b"Content-Length: 18446744073709551615")
    s.sendto(bad, ("127.0.0.1", sip_port))
    time.sleep(0.5)
    answered = answers_options(sip_port)
    ready = http_code(srv.port, "/readyz")
    srv.stop()
    return f"OPTIONS after it {'answered' if answered else 'unanswered'}; /readyz {ready}"


def http_code(port, path):
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        head = c.recv(100).decode("latin-1")
        c.close()
        return head.split(" ")[1]
    except (OSError, IndexError):
        return "none"


def paced(count, per_s, send, srv, peak):
    """Calls send(i) `count` times at `per_s` a second; the server's peak RSS meanwhile."""
    start = time.monotonic()
    for i in range(count):
        send(i)
        if i % 200 == 0:
            peak = max(peak, srv.rss())
        time.sleep(max(0.0, start + (i + 1) / per_s - time.monotonic()))
    return peak


def peak_for(srv, seconds, peak):
    """The server's peak RSS over the next `seconds`."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, srv.rss())
        time.sleep(0.25)
    return peak


def reflect(binary):
    """1,000 INVITEs of 60 KB from a stranger in 1 s, each Via naming a third party by maddr."""
    sip_port = free_port()
    srv = Server(binary, sip_config(sip_port))
    victim, source = Counter("127.0.0.3"), Counter("127.0.0.2")
    vip, vport = victim.addr().split(":")
    cpu0 = cpu_s(srv.proc.pid)
    msg = lambda i: invite(f"{vip}:{vport};maddr={vip}", f"r{i}", pad=60_000)  # noqa: E731
    sent = sum(len(msg(i)) for i in range(1000))
    peak = paced(1000, 1000, lambda i: source.sock.sendto(msg(i), ("127.0.0.1", sip_port)), srv, srv.rss())
    peak = peak_for(srv, 34, peak)  # a transaction's retransmissions end within 32 s
    victim.stop()
    source.stop()
    cpu = cpu_s(srv.proc.pid) - cpu0
    row = (
        f"third party: {victim.datagrams:,} datagrams, {victim.bytes / 1e6:.0f} MB "
        f"({victim.bytes / sent:.1f}x what was sent); source: {source.datagrams:,}, "
        f"{source.bytes / 1e6:.1f} MB; +{peak - srv.rss0:.0f} MB peak, {cpu:.1f} CPU-s"
    )
    srv.stop()
    return row


def flood(binary):
    """5,000 INVITEs from a stranger at 1,000 a second (2.5 Mbit/s)."""
    sip_port = free_port()
    srv = Server(binary, sip_config(sip_port))
    source = Counter("127.0.0.2")
    cpu0, log0 = cpu_s(srv.proc.pid), log_bytes(srv)
    send = lambda i: source.sock.sendto(invite(source.addr(), f"f{i}"), ("127.0.0.1", sip_port))  # noqa: E731
    peak = peak_for(srv, 5, paced(5000, 1000, send, srv, srv.rss()))
    held = srv.rss() - srv.rss0
    source.stop()
    cpu = cpu_s(srv.proc.pid) - cpu0
    answered = answers_options(sip_port)
    row = (
        f"+{peak - srv.rss0:.0f} MB peak, +{held:.0f} MB 5 s after; {cpu:.1f} CPU-s; "
        f"{source.datagrams:,} answers ({source.bytes / 1e6:.1f} MB); log +{(log_bytes(srv) - log0) / 1e3:.0f} KB; "
        f"the trunk's OPTIONS {'answered' if answered else 'unanswered'}"
    )
    srv.stop()
    return row


def junk(binary):
    """13 MB of junk: 1,000 datagrams of 13 KB whose first line is escape codes."""
    sip_port = free_port()
    srv = Server(binary, sip_config(sip_port))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.2", 0))
    log0 = log_bytes(srv)
    line = ("\x1b[31m" * 2600).encode() + b"\r\n\r\n"
    for _ in range(1000):
        s.sendto(line, ("127.0.0.1", sip_port))
        time.sleep(0.0005)
    time.sleep(2)
    grown = log_bytes(srv) - log0
    srv.stop()
    return f"log +{grown / 1e6:.2f} MB"


def secrets(binary):
    """200 unauthenticated client-secret mints from one address, each with its whole declared
    body of 256 KiB."""
    srv = Server(binary, sip_config(free_port()))
    conns = []
    head = (
        "POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\nContent-Length: 262144\r\n\r\n{"
    ).encode()
    peak = srv.rss()
    for _ in range(200):
        try:
            c = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
            c.setblocking(False)
            try:
                c.send(head + b" " * (262144 - 1))
            except OSError:
                pass
            conns.append(c)
        except OSError:
            pass
        peak = max(peak, srv.rss())
    end = time.monotonic() + 2
    while time.monotonic() < end:
        peak = max(peak, srv.rss())
        time.sleep(0.1)
    grown = peak - srv.rss0
    still_open = 0
    for c in conns:
        c.settimeout(0.05)
        c.setblocking(True)
        c.settimeout(0.05)
        try:
            data = c.recv(65536)
            while data:
                data = c.recv(65536)
        except socket.timeout:
            still_open += 1
        except OSError:
            pass
        c.close()
    srv.stop()
    return f"+{grown:.0f} MB peak; {still_open} of {len(conns)} connections still open 2 s after"


def queued(binary):
    """40 OpenAI clients from 5 addresses, queued behind the only worker, each sending 10
    conversation items of 30 s of audio."""
    try:
        from websockets.sync.client import connect
    except ImportError:
        return "skipped (no websockets module)"
    srv = Server(binary, sip_config(free_port()))
    holder = connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?mode=audio&api_key={KEY}")
    while "queue_done" not in holder.recv(timeout=10):  # the only worker is the holder's
        pass
    audio = base64.b64encode(bytes(30 * 24000 * 2)).decode()
    item = json.dumps(
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio}]},
        }
    )
    clients, refused = [], 0
    peak = srv.rss()
    for n in range(40):
        sock = socket.create_connection(("127.0.0.1", srv.port), source_address=(f"127.0.0.{10 + n % 5}", 0))
        c = connect(f"ws://127.0.0.1:{srv.port}/v1/realtime?model=omni&api_key={KEY}", sock=sock, max_size=None)
        for _ in range(10):
            c.send(item)
        clients.append(c)
        peak = max(peak, srv.rss())
    time.sleep(3)
    for c in clients:
        try:
            while True:
                event = json.loads(c.recv(timeout=0.2))
                refused += event.get("type") == "error" and event["error"].get("code") == "buffer_full"
        except (TimeoutError, Exception):
            pass
    peak = max(peak, srv.rss(), srv.peak())
    for c in clients:
        c.close()
    holder.close()
    srv.stop()
    return f"+{peak - srv.rss0:.0f} MB peak; {refused} of 400 items refused (buffer_full)"


ATTACKS = [
    ("one datagram with Content-Length 2^64-1 from the trunk's address", overflow),
    ("1,000 INVITEs of 60 KB in 1 s from a stranger, each Via's maddr a third party", reflect),
    ("5,000 INVITEs from a stranger at 1,000/s", flood),
    ("13 MB of junk datagrams from a stranger", junk),
    ("200 unauthenticated client-secret mints from one address, 256 KiB bodies", secrets),
    ("40 queued OpenAI clients from 5 addresses, 10 items of 30 s audio each", queued),
]


def main():
    pairs = [a.split("=", 1) for a in sys.argv[1:]]
    if not pairs:
        raise SystemExit(__doc__)
    print("| attack | " + " | ".join(label for label, _ in pairs) + " |")
    print("|---|" + "---|" * len(pairs))
    for name, attack in ATTACKS:
        cells = [attack(binary) for _, binary in pairs]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
