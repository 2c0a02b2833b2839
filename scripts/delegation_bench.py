"""Delegation measured (delegation_bench.sh): a voice that calls no tools (MiniCPM-o workers, the
mock of scripts/mock_worker.py) with the gateway's decider beside it (a chat-completions fake in
this process, answering a call at once), so that what is measured is the gateway's path.

Usage: python delegation_bench.py BIN ASR_LIBRARY WHISPER_MODEL [ROUNDS] [SESSIONS] [SECONDS]

With CPU_MODEL=LIBRARY (libomni_cascade.so) and OMNI_MODELS set, the decider is instead a chat
worker of the gateway's own pool running the CPU model's LLM (`decider = "pool"`), and only the
latency part runs: what a call costs when the decider is the 0.5B model on these two cores.
TOOL_CHOICE sets the session's tool_choice (auto; "required" makes the small model call).

1. Latency, one OpenAI client, ROUNDS (20) rounds of: "What is the weather in Paris?" spoken by
   espeak-ng, paced at real time, then silence paced at real time until the call comes. Measured
   on the client's clock: the end of the sentence (its last sample sent) to
   `response.function_call_arguments.done`; the result sent (`function_call_output` and
   `response.create`) to the worker's `prepare` (the re-preparation, on the mock's clock, which
   is the same monotonic clock) and to the first `response.output_audio.delta` of the answer
   (the mock speaks on the third step after a prepare; the client is silent, so the gateway steps
   it at its own pace).
2. Gateway CPU per session-second, SESSIONS (200) sessions for SECONDS (60) each, with the
   decider on and off (Whisper on in both): each session streams silence at real time and says
   the sentence once, at a moment spread over the run, and asks for its transcript (so Whisper
   runs in both); with the decider on it gets the call and answers it with the result and
   `response.create` (a re-preparation).

Prints a Markdown table.
"""

import asyncio
import base64
import http.server
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import wave

import websockets

HERE = os.path.dirname(os.path.abspath(__file__))
RATE = 16000
SENTENCE = os.environ.get("SENTENCE", "What is the weather in Paris?")
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city now",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


class Decider(http.server.BaseHTTPRequestHandler):
    """A chat-completions server that calls get_weather for Paris, at once."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls",
                           "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "x", "type": "function",
                                       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def espeak(text):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.wav")
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", path, "--", text], check=True)
        with wave.open(path) as w:
            source, frames = w.getframerate(), w.readframes(w.getnframes())
    samples = struct.unpack(f"<{len(frames) // 2}h", frames)
    n = int(len(samples) * RATE / source)
    return struct.pack(f"<{n}h", *(samples[min(int(i * source / RATE), len(samples) - 1)] for i in range(n)))


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Gateway:
    def __init__(self, bin, workers, asr, model, decider, times):
        self.dir = tempfile.mkdtemp()
        env = dict(os.environ, MOCK_TIMES=times)
        self.mock = subprocess.Popen([sys.executable, os.path.join(HERE, "mock_worker.py"), str(workers)],
                                     stdout=subprocess.PIPE, text=True, env=env)
        ports = self.mock.stdout.readline().split()[1:]
        self.port = free_port()
        config = [f'[server]\nbind = "127.0.0.1:{self.port}"\nmax_connections_per_ip = 0\nmax_waiting_per_ip = 0\n',
                  f'[transcription]\nenabled = true\nlibrary = "{asr}"\nmodel = "{model}"\nthreads = 2\nmax_waiting = 256\n']
        if decider:
            config.append(decider)
        for i, p in enumerate(ports):
            config.append(f'[[workers]]\nname = "w{i}"\nbackend = "minicpmo-worker"\nurl = "http://127.0.0.1:{p}"\n'
                          'modes = ["audio", "video"]\n')
        expected = workers + decider.count("[[workers]]") if decider else workers
        path = os.path.join(self.dir, "gw.toml")
        open(path, "w").write("".join(config))
        self.log = open(os.path.join(self.dir, "gw.log"), "w")
        self.proc = subprocess.Popen([bin, "--config", path], stdout=self.log, stderr=self.log,
                                     env=dict(os.environ, RUST_LOG=os.environ.get("BENCH_LOG", "warn")))
        deadline = time.monotonic() + 60
        while True:
            try:
                import urllib.request
                body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics").read().decode()
                idle = [l for l in body.splitlines() if l.startswith('omni_workers{state="idle"}')]
                if idle and float(idle[0].split()[1]) == expected:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the gateway did not start: {open(os.path.join(self.dir, 'gw.log')).read()[-2000:]}")
            time.sleep(0.1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()
        self.mock.terminate()
        self.mock.wait()


async def connect(port):
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime?model=omni", max_size=None)
    while json.loads(await ws.recv())["type"] != "session.created":
        pass
    # Transcripts asked for: Whisper runs whether the decider is on or off.
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief.",
        "tools": TOOLS, "tool_choice": os.environ.get("TOOL_CHOICE", "auto"),
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE},
                                            "transcription": {"model": "whisper-1"},
                                            "turn_detection": {"type": "server_vad"}}}}}))
    while json.loads(await ws.recv())["type"] != "session.updated":
        pass
    return ws


async def pace(ws, pcm, stop=None, ms=100):
    """Sends pcm16 at real time, `ms` a message; silence after it until `stop` is set."""
    step = RATE * ms // 1000 * 2
    start = time.monotonic()
    i = 0
    while i < len(pcm) or (stop is not None and not stop.is_set()):
        piece = pcm[i:i + step] if i < len(pcm) else b"\0" * step
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()}))
        i += step
        ahead = start + i / (2 * RATE) - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
    return start + len(pcm) / (2 * RATE)


async def latency(port, speech, rounds, times):
    ws = await connect(port)
    to_call, to_prepare, to_audio = [], [], []
    for _ in range(rounds):
        stop = asyncio.Event()
        sender = asyncio.create_task(pace(ws, b"\0" * 8000 + speech, stop))
        got = None
        deadline = time.monotonic() + 30
        while got is None and time.monotonic() < deadline:
            try:
                e = json.loads(await asyncio.wait_for(ws.recv(), deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if e["type"] == "response.function_call_arguments.done":
                got = time.monotonic()
            elif e["type"] == "error":
                print(f"error: {e['error']}", file=sys.stderr)
        stop.set()
        ended = await sender
        if got is None:
            print("no call within 30 s of the sentence", file=sys.stderr)
            continue
        to_call.append(got - ended)
        # Whatever the voice was saying is let finish; then the result.
        await asyncio.sleep(0.5)
        while True:
            try:
                json.loads(await asyncio.wait_for(ws.recv(), 0.05))
            except asyncio.TimeoutError:
                break
        sent = time.monotonic()
        await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "function_call_output",
                                  "call_id": e["call_id"], "output": "21 degrees and sunny"}}))
        await ws.send(json.dumps({"type": "response.create"}))
        while json.loads(await ws.recv())["type"] != "response.output_audio.delta":
            pass
        to_audio.append(time.monotonic() - sent)
        prepares = [float(l.split()[1]) for l in open(times) if l.startswith("prepare ")]
        to_prepare.append(prepares[-1] - sent)
        while json.loads(await ws.recv())["type"] != "response.done":
            pass
    await ws.close()
    return to_call, to_prepare, to_audio


async def load(port, speech, sessions, seconds, decide):
    calls = [0]

    async def one(k):
        await asyncio.sleep(k * 2.0 / sessions * 5)  # connect over 10 s
        ws = await connect(port)
        say_at = random.uniform(5, seconds - 10)
        stop = asyncio.Event()

        async def reader():
            async for text in ws:
                e = json.loads(text)
                if e["type"] == "response.function_call_arguments.done":
                    calls[0] += 1
                    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                        "type": "function_call_output", "call_id": e["call_id"], "output": "21 degrees"}}))
                    await ws.send(json.dumps({"type": "response.create"}))

        r = asyncio.create_task(reader())
        pcm = b"\0" * int(say_at * RATE) * 2 + speech + b"\0" * int((seconds - say_at) * RATE) * 2
        await pace(ws, pcm[: seconds * RATE * 2], ms=200)
        await ws.close()
        r.cancel()

    await asyncio.gather(*(one(k) for k in range(sessions)))
    return calls[0]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    bin, asr, model = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    sessions = int(sys.argv[5]) if len(sys.argv) > 5 else 200
    seconds = int(sys.argv[6]) if len(sys.argv) > 6 else 60
    random.seed(7)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Decider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    speech = espeak(SENTENCE)
    times = tempfile.mktemp()
    open(times, "w").close()
    via_http = (f'[delegation]\ndecider = "http"\nurl = "http://127.0.0.1:{server.server_address[1]}/v1"\nmodel = "m"\n'
            'max_waiting = 256\nthreads = 4\n')
    cpu = os.environ.get("CPU_MODEL")
    if cpu:
        models = os.environ["OMNI_MODELS"]
        pool = (f'[delegation]\ndecider = "pool"\ntimeout_s = 30\n[[workers]]\nname = "decider"\nbackend = "library"\n'
                f'library = "{cpu}"\nisolation = "process"\nmodes = ["chat"]\n[workers.options]\ntemperature = 0\n'
                f'llm_model = "{models}/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"\nasr_model = "{models}/ggml-tiny.en.bin"\n'
                f'voice = "{models}/en_US-joe-medium.onnx"\nonnxruntime_library = "{models}/libonnxruntime.so.1.31.1"\n'
                'threads = 2\nmax_answer_tokens = 64\n')
        gw = Gateway(bin, 1, asr, model, pool, times)
        try:
            to_call, _, _ = asyncio.run(latency(gw.port, speech, rounds, times))
        finally:
            gw.stop()
        ms = lambda x: f"{1000 * x:.0f} ms"
        if to_call:
            print(f"| end of the sentence → function call, decided by the CPU model's 0.5B LLM on the pool, tool_choice {os.environ.get('TOOL_CHOICE', 'auto')} | {ms(pct(to_call, 50))} | {ms(pct(to_call, 90))} | {len(to_call)} of {rounds} |")
        else:
            print(f"| end of the sentence → function call, decided by the CPU model's 0.5B LLM on the pool | no call | | 0 of {rounds} |")
        return
    gw = Gateway(bin, 1, asr, model, via_http, times)
    try:
        to_call, to_prepare, to_audio = asyncio.run(latency(gw.port, speech, rounds, times))
    finally:
        gw.stop()
    ms = lambda x: f"{1000 * x:.0f} ms"
    print(f"| end of the sentence → function call (Whisper tiny.en, decider instant) | {ms(pct(to_call, 50))} | {ms(pct(to_call, 90))} | {rounds} |")
    print(f"| result sent → the voice's re-preparation reaches the worker | {ms(pct(to_prepare, 50))} | {ms(pct(to_prepare, 90))} | {rounds} |")
    print(f"| result sent → first audio of the answer (mock speaks 3 steps after a prepare) | {ms(pct(to_audio, 50))} | {ms(pct(to_audio, 90))} | {rounds} |")
    for on in (False, True):
        gw = Gateway(bin, sessions, asr, model, via_http if on else None, times)
        try:
            before, t0 = cpu_seconds(gw.proc.pid), time.monotonic()
            calls = asyncio.run(load(gw.port, speech, sessions, seconds, on))
            cpu, wall = cpu_seconds(gw.proc.pid) - before, time.monotonic() - t0
        finally:
            gw.stop()
        per = 1000 * cpu / (sessions * seconds)
        print(f"| {sessions} sessions × {seconds} s, decider {'on' if on else 'off'}: gateway CPU per session-second | {per:.2f} ms | {cpu:.1f} s CPU in {wall:.0f} s | {calls} calls |")


if __name__ == "__main__":
    main()
