"""What the framework cases share: speech for the reference backend, step results, waits.

Every case prints one line per step, `ok STEP: details` or `not ok STEP: details`, and exits 1
if any step failed. Waits are on events, each bounded by a timeout; audio is paced at real
time, as a microphone would send it.
"""

import asyncio
import math
import os
import struct
import subprocess
import sys
import tempfile
import time
import wave

RATE = 24000  # the frameworks' wire rate (PCM16 mono)
TIMEOUT = 30.0


def tone(seconds, rate=RATE, hz=440, amplitude=0.5):
    """PCM16 little-endian mono: loud enough for the gateway's VAD and the reference's."""
    n = int(seconds * rate)
    return b"".join(struct.pack("<h", int(amplitude * 32767 * math.sin(2 * math.pi * hz * i / rate))) for i in range(n))


def silence(seconds, rate=RATE):
    return b"\x00\x00" * int(seconds * rate)


def speech(tone_s=1.5, silence_s=1.0):
    """A spoken turn: speech, then the pause that ends it."""
    return tone(tone_s) + silence(silence_s)


def spoken(text, rate=RATE):
    """`text` spoken by espeak-ng, as PCM16 mono at `rate` (for a gateway that transcribes it)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "speech.wav")
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", path, "--", text], check=True)
        with wave.open(path) as w:
            source, frames = w.getframerate(), w.readframes(w.getnframes())
    samples = struct.unpack(f"<{len(frames) // 2}h", frames)
    n = int(len(samples) * rate / source)
    out = []
    for i in range(n):
        x = i * source / rate
        j = int(x)
        a, b = samples[min(j, len(samples) - 1)], samples[min(j + 1, len(samples) - 1)]
        out.append(int(a + (b - a) * (x - j)))
    return struct.pack(f"<{n}h", *out)


async def paced(pcm, send, ms=20, rate=RATE):
    """Sends pcm in `ms` chunks at real time (a microphone's pace)."""
    step = rate * ms // 1000 * 2
    start = time.monotonic()
    for i in range(0, len(pcm), step):
        await send(pcm[i:i + step])
        ahead = start + (i // step + 1) * ms / 1000 - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)


class Steps:
    def __init__(self):
        self.failed = 0

    def check(self, step, ok, detail=""):
        print(f"{'ok' if ok else 'not ok'} {step}: {detail}", flush=True)
        self.failed += not ok
        return ok

    def exit(self):
        print(f"# {self.failed} step(s) failed", flush=True)
        sys.exit(1 if self.failed else 0)


class Inbox:
    """Events as they come, and waits for the one a predicate picks."""

    def __init__(self):
        self.queue = asyncio.Queue()
        self.seen = []

    def put(self, event):
        self.queue.put_nowait(event)

    async def until(self, pick, timeout=TIMEOUT):
        """The first event `pick` accepts, with what came before it; None at the timeout."""
        seen = []
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return None, seen
            try:
                event = await asyncio.wait_for(self.queue.get(), left)
            except asyncio.TimeoutError:
                return None, seen
            seen.append(event)
            self.seen.append(event)
            if pick(event):
                return event, seen
