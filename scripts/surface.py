"""The security audit's attacks on the calls, client secrets, keys and node surface, re-run
against release binaries side by side (docs/reliability.md, "The whole surface"). Each attack
gets a fresh server (one reference worker, an API key, the shipped bounds otherwise); its memory
is read from /proc before, during and after, its log lines counted, and what the attacker and a
right client got is printed as one markdown row per binary.

    python3 scripts/surface.py LABEL=BINARY...     (scripts/surface.sh builds them)

The call attacks need aiortc for a real SDP offer (the tests' .venv has it); without it they are
skipped.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

KEY = "surface-key-0123456789abcdef"
OTHER_KEY = "surface-other-0123456789abcd"
TOKEN = "Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0="


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


class Server:
    """A fresh omni-gateway (or node) on a free port, its stderr in a file."""

    def __init__(self, binary, config, args=(), port=None):
        self.dir = tempfile.mkdtemp()
        self.port = port or free_port()
        path = os.path.join(self.dir, "config.toml")
        with open(path, "w") as f:
            f.write(config.replace("PORT", str(self.port)))
        self.log = open(os.path.join(self.dir, "log"), "w+")
        env = dict(os.environ, RUST_LOG="info")
        self.proc = subprocess.Popen([binary, "--config", path, *args], stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit(f"{binary} did not start: {self.lines()[-5:]}")
                time.sleep(0.05)
        time.sleep(0.5)  # its worker opens
        self.rss0 = self.rss()

    def rss(self):
        return status_kb(self.proc.pid, "VmRSS") / 1024

    def peak(self):
        return status_kb(self.proc.pid, "VmHWM") / 1024

    def lines(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read().splitlines()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def gateway_config(extra=""):
    return f"""[server]
bind = "127.0.0.1:PORT"
[auth]
api_keys = ["{KEY}", "{OTHER_KEY}"]
[[workers]]
name = "w"
{extra}
"""


def http(port, method, path, headers, body=b"", source="127.0.0.1", timeout=20):
    """One request; its status and body (0 when the connection failed)."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    except OSError:
        return 0, ""
    try:
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        s.sendall(head.encode() + body)
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
        text = raw.decode("latin-1")
        code = int(text.split(" ", 2)[1]) if text.startswith("HTTP/") else 0
        return code, text.split("\r\n\r\n", 1)[-1]
    except OSError:
        return 0, ""
    finally:
        s.close()


def offer():
    try:
        import asyncio

        from aiortc import RTCPeerConnection
    except ImportError:
        return None

    async def make():
        pc = RTCPeerConnection()
        pc.addTransceiver("audio", direction="sendrecv")
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return sdp

    return asyncio.run(make())


def offer_form(binary):
    """A call offer as a form whose first part's headers never end: 256 MiB, chunked."""
    srv = Server(binary, gateway_config())
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(
        (
            f"POST /v1/realtime/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: multipart/form-data; boundary=XyZ\r\nTransfer-Encoding: chunked\r\n\r\n"
        ).encode()
    )
    opening = b'--XyZ\r\nContent-Disposition: form-data; name="sdp"\r\nX-Pad: '
    piece = b"a" * 65536
    sent, start, peak_rss = 0, time.monotonic(), 0.0
    for i in range(4096):
        body = opening + piece[len(opening):] if i == 0 else piece
        try:
            s.sendall(b"%x\r\n" % len(body) + body + b"\r\n")
        except OSError:
            break
        sent += len(body)
        if i % 64 == 0:
            peak_rss = max(peak_rss, srv.rss())
    s.settimeout(30)
    try:
        answer = s.recv(200).decode("latin-1")
    except OSError:
        answer = ""
    took = time.monotonic() - start
    code = answer.split(" ", 2)[1] if answer.startswith("HTTP/") else "closed"
    grown = max(peak_rss, srv.rss(), srv.peak()) - srv.rss0
    cpu = sum(int(x) for x in open(f"/proc/{srv.proc.pid}/stat").read().split(")")[1].split()[11:13]) / os.sysconf("SC_CLK_TCK")
    s.close()
    srv.stop()
    return f"{sent / 2**20:.1f} MiB sent, then {code} after {took:.1f} s; +{grown:.0f} MB peak, {cpu:.1f} CPU-s"


def mint_stall(binary):
    """600 mint requests from one address, each 255 KiB of a declared 256 KiB body, stalled."""
    srv = Server(binary, gateway_config())
    conns, refused = [], 0
    head = (
        f"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 262144\r\n\r\n"
    ).encode()
    body = b"{" + b" " * (255 * 1024)
    for _ in range(600):
        try:
            c = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
            c.sendall(head + body)
            conns.append(c)
        except OSError:
            refused += 1
    time.sleep(2)
    grown = srv.rss() - srv.rss0
    start = time.monotonic()
    # How long the stalled ones are held: each answered (or closed) by the server.
    open_after = 0
    deadline = start + 15
    for c in conns:
        c.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if c.recv(100):
                pass
        except OSError:
            open_after += 1
    # And a right client after: a mint answers.
    code, _ = http(srv.port, "POST", "/v1/realtime/client_secrets", {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, b"{}")
    for c in conns:
        c.close()
    srv.stop()
    return f"{len(conns)} held, {refused} refused at connect; +{grown:.0f} MB; {open_after} still held 15 s later; a mint after: {code}"


def call_ports(binary, sdp):
    """1,000 call offers with one key from 125 addresses (8 each, as one IPv6 /56 gives 256
    /64s), none ever connecting; then another key from another address."""
    srv = Server(binary, gateway_config())
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"}
    counts = {}
    start = time.monotonic()
    for i in range(1000):
        code, _ = http(srv.port, "POST", "/v1/realtime/calls", headers, sdp.encode(), source=f"127.0.1.{i // 8 + 1}")
        counts[code] = counts.get(code, 0) + 1
    took = time.monotonic() - start
    other = {"Authorization": f"Bearer {OTHER_KEY}", "Content-Type": "application/sdp"}
    code, _ = http(srv.port, "POST", "/v1/realtime/calls", other, sdp.encode(), source="127.0.2.1")
    lines = len(srv.lines())
    grown = srv.rss() - srv.rss0
    srv.stop()
    shown = ", ".join(f"{n} x {c}" for c, n in sorted(counts.items()))
    return f"{shown} in {took:.1f} s; another key from another address: {code}; +{grown:.0f} MB; {lines} log lines"


def wrong_keys(binary):
    """Ten wrong keys from one address, then eight right ones from it: how long each right one waits."""
    srv = Server(binary, gateway_config())
    for i in range(10):
        http(srv.port, "POST", "/v1/realtime/client_secrets", {"Authorization": f"Bearer wrong-{i:024d}"}, b"{}")
    waits, codes = [], []
    for _ in range(8):
        t = time.monotonic()
        code, _ = http(srv.port, "POST", "/v1/realtime/client_secrets", {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, b"{}")
        waits.append(time.monotonic() - t)
        codes.append(code)
    srv.stop()
    return f"right keys: {sorted(set(codes))}, waited {min(waits) * 1000:.0f} to {max(waits) * 1000:.0f} ms"


def node_idle(binary):
    """1,100 idle connections to a node from one address; then a gateway links to it."""
    node = Server(
        binary,
        f'[node]\nbind = "127.0.0.1:PORT"\ntoken = "{TOKEN}"\n[[workers]]\nname = "w"\n',
        args=("node",),
    )
    before = len(node.lines())
    conns = []
    for _ in range(1100):
        try:
            conns.append(socket.create_connection(("127.0.0.1", node.port), timeout=2))
        except OSError:
            pass
    time.sleep(2)
    grown = node.rss() - node.rss0
    start = time.monotonic()
    gw = Server(binary, f'[server]\nbind = "127.0.0.1:PORT"\n[[nodes]]\nname = "n1"\naddress = "127.0.0.1:{node.port}"\ntoken = "{TOKEN}"\n')
    joined = None
    while time.monotonic() - start < 20:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{gw.port}/status", timeout=2) as r:
                workers = json.load(r)["workers"]
            if workers and all(w["state"] == "idle" for w in workers):
                joined = time.monotonic() - start
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    lines = len(node.lines()) - before
    for c in conns:
        c.close()
    gw.stop()
    node.stop()
    joined = f"{joined:.1f} s" if joined is not None else "not within 20 s"
    return f"{len(conns)} open; +{grown:.0f} MB; {lines} node log lines; a gateway's worker joined in {joined}"


def main():
    pairs = [a.split("=", 1) for a in sys.argv[1:]]
    if not pairs:
        raise SystemExit(__doc__)
    sdp = offer()
    attacks = [
        ("a call offer as a form whose part headers never end (up to 256 MiB)", offer_form),
        ("600 stalled client-secret mints from one address (255 KiB each)", mint_stall),
        ("1,000 call offers from one key and 125 addresses, never connected", (lambda b: call_ports(b, sdp)) if sdp else None),
        ("10 wrong keys, then 8 right ones, from one address", wrong_keys),
        ("1,100 idle connections to a node", node_idle),
    ]
    print("| attack | " + " | ".join(label for label, _ in pairs) + " |")
    print("|---|" + "---|" * len(pairs))
    for name, run in attacks:
        if run is None:
            print(f"| {name} | " + " | ".join("skipped (no aiortc)" for _ in pairs) + " |", flush=True)
            continue
        print(f"| {name} | " + " | ".join(run(binary) for _, binary in pairs) + " |", flush=True)


if __name__ == "__main__":
    main()
