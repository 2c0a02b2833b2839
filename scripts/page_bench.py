#!/usr/bin/env python3
"""The first conversation as a user has it: the page in Chromium, spoken questions on a fake
microphone, one fresh audio session per question, against a running gateway.

For each of the ten factual questions of cascade_bench.py, Chromium (headless, through
chromedriver's WebDriver API) opens the page, starts an audio session over TRANSPORT, and its
microphone plays 1.5 s of silence, the question (espeak-ng) and silence. Read from the page
(`window.omniStats`):

  - the reply time the page shows: from the last moment its microphone heard the user to the
    first sound of the model's voice (over WebSocket, when the player starts the audio; over
    WebRTC, `output_audio_buffer.started`: the browser's jitter buffer, some tens of
    milliseconds, comes on top);
  - what the model heard (the user's transcript) and whether the answer holds a right word.

    python3 scripts/page_bench.py URL [--transport webrtc|websocket] [--questions N] [--json FILE]
        [--processing on|off]

--processing off unticks the page's echo cancellation, noise suppression and auto gain (on by
default, as for a user).

Needs chromium and chromium-driver (Debian's), and espeak-ng.
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import wave

sys.path.insert(0, os.path.dirname(__file__))
from cascade_bench import FACTS, speech  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
# How long one question may take, from Start to the answer's end.
QUESTION_S = 40


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class WebDriver:
    """The few WebDriver commands this needs, over chromedriver's HTTP API."""

    def __init__(self):
        self.port = free_port()
        self.child = subprocess.Popen(["chromedriver", f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("chromedriver did not start")

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.load(r)["value"]

    def session(self, microphone):
        args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                f"--use-file-for-fake-audio-capture={microphone}%noloop",
                "--autoplay-policy=no-user-gesture-required"]
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}}
        return self.call("POST", "/session", caps)["sessionId"]

    def js(self, sid, script):
        return self.call("POST", f"/session/{sid}/execute/sync", {"script": script, "args": []})

    def close(self):
        os.killpg(self.child.pid, signal.SIGTERM)
        self.child.wait()


def microphone(path, text):
    """A 16 kHz WAV: 1.5 s of silence, `text` spoken, 8 s of silence."""
    samples = [0.0] * 24000 + speech(text) + [0.0] * 128000
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"".join(int(max(-1.0, min(1.0, s)) * 32767).to_bytes(2, "little", signed=True)
                               for s in samples))


def ask(driver, url, transport, question, words, processing=True):
    with tempfile.TemporaryDirectory() as tmp:
        wav = os.path.join(tmp, "question.wav")
        microphone(wav, question)
        sid = driver.session(wav)
        try:
            driver.call("POST", f"/session/{sid}/url", {"url": url})
            driver.js(sid, f"""
                document.getElementById('mode').value = 'audio';
                document.getElementById('mode').dispatchEvent(new Event('change'));
                document.getElementById('transport').value = '{'websocket' if transport == 'websocket' else 'auto'}';
                document.getElementById('processing').checked = {'true' if processing else 'false'};
                document.getElementById('start').click();""")
            deadline = time.time() + QUESTION_S
            stats = {}
            while time.time() < deadline:
                stats = driver.js(sid, "return window.omniStats;")
                # Answered and timed (over WebRTC, response.done may come before the voice
                # starts playing), or ended.
                if stats["answers"] >= 1 and stats["replySeconds"] or stats["state"] == "ended":
                    break
                time.sleep(0.2)
            driver.js(sid, "document.getElementById('stop').click();")
        finally:
            driver.call("DELETE", f"/session/{sid}")
    text = stats.get("text", "")
    return {
        "question": question,
        "heard": " ".join(h or "" for h in stats.get("heard", [])),
        "answer": text,
        "right": any(w in text.lower() for w in words),
        "reply_s": (stats.get("replySeconds") or [None])[0],
        # (WebSocket: when the first audio arrived, before the player scheduled it)
        "arrival_s": (stats.get("replyArrivalSeconds") or [None])[0],
        "transport": stats.get("transport"),
        "errors": stats.get("errors", []),
    }


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    url = args[0].rstrip("/") + "/"
    opt = {"--transport": "webrtc", "--questions": str(len(FACTS)), "--json": None, "--processing": "on"}
    for i in range(1, len(args) - 1, 2):
        opt[args[i]] = args[i + 1]
    driver = WebDriver()
    results = []
    try:
        for question, words in FACTS[: int(opt["--questions"])]:
            r = ask(driver, url, opt["--transport"], question, words, opt["--processing"] != "off")
            results.append(r)
            reply = "-" if r["reply_s"] is None else f"{r['reply_s']:.2f} s"
            print(f"{reply:>8}  {'right' if r['right'] else 'WRONG':5}  heard {r['heard']!r}  said {r['answer'][:70]!r}",
                  flush=True)
    finally:
        driver.close()
    times = sorted(r["reply_s"] for r in results if r["reply_s"] is not None)
    used = sorted({r["transport"] for r in results if r["transport"]})
    if used != [opt["--transport"]]:
        print(f"(asked for {opt['--transport']}, the page used {', '.join(used) or 'none'})")
    arrivals = sorted(r["arrival_s"] for r in results if r["arrival_s"] is not None)
    summary = {
        "transport": opt["--transport"],
        "questions": len(results),
        "answered": len(times),
        "right": sum(r["right"] for r in results),
        "reply_p50_s": statistics.median(times) if times else None,
        "reply_min_s": times[0] if times else None,
        "reply_max_s": times[-1] if times else None,
        "arrival_p50_s": statistics.median(arrivals) if arrivals else None,
        "results": results,
    }
    print(f"{opt['--transport']}: {summary['right']} of {len(results)} right; reply time p50 "
          f"{summary['reply_p50_s'] or float('nan'):.2f} s ({summary['reply_min_s'] or float('nan'):.2f} to "
          f"{summary['reply_max_s'] or float('nan'):.2f} s), {len(times)} timed"
          + (f"; the first audio arrived {summary['arrival_p50_s']:.2f} s p50"
             if arrivals and opt["--transport"] == "websocket" else ""))
    if opt["--json"]:
        with open(opt["--json"], "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
