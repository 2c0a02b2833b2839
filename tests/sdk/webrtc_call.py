"""A WebRTC call to omni-gateway from an independent WebRTC stack (aiortc), as the OpenAI
Realtime API's WebRTC clients make them.

Usage: python webrtc_call.py PORT API_KEY [--queued]

With --queued the only worker is busy when the call is made: the call waits in the queue,
prints `queued POSITION` (whoever holds the worker then frees it), and goes on once assigned.
1. Mints a client secret with the API key (POST /v1/realtime/client_secrets), with the session's
   settings in it; the call presents only the secret.
2. Posts an SDP offer (an Opus track and the `oai-events` data channel) to /v1/realtime/calls.
3. Speaks a tone (1.5 s, then silence) on the track: server VAD ends the turn, and the model
   answers on the remote track, between output_audio_buffer.started and .stopped.
4. Speaks again and clears the model's voice as soon as it starts: output_audio_buffer.cleared,
   and no more of it on the track.
5. Hangs up over HTTP.
Prints one JSON object with what it saw; exits 1 on a failure.
"""

import asyncio
import fractions
import json
import math
import sys
import time
import urllib.error
import urllib.request

import numpy as np
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from av import AudioFrame

TIMEOUT = 30
RATE = 48000
FRAME = 960  # 20 ms


def post(url, body, headers):
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class Voice(MediaStreamTrack):
    """The user's microphone: a 220 Hz tone while `speaking`, silence otherwise."""

    kind = "audio"

    def __init__(self):
        super().__init__()
        self.speaking_until = 0.0
        self.pts = 0
        self.start = None

    def speak(self, seconds):
        self.speaking_until = time.monotonic() + seconds

    async def recv(self):
        if self.start is None:
            self.start = time.monotonic()
        # Paced in real time, as a microphone is.
        wait = self.start + self.pts / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        t = np.arange(self.pts, self.pts + FRAME)
        loud = time.monotonic() < self.speaking_until
        samples = (np.sin(2 * math.pi * 220 * t / RATE) * (0.3 * 32767 if loud else 0)).astype(np.int16)
        frame = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self.pts
        frame.time_base = fractions.Fraction(1, RATE)
        self.pts += FRAME
        return frame


class Call:
    def __init__(self):
        self.events = []
        self.waiters = []
        self.loud_ms = 0  # the model's voice heard on the track (frames above a floor)
        self.loud_after_clear_ms = 0
        self.cleared_at = None

    def on_event(self, text):
        event = json.loads(text)
        self.events.append(event)
        for kinds, fut in list(self.waiters):
            if event["type"] in kinds and not fut.done():
                fut.set_result(event)

    async def wait(self, *kinds):
        for e in self.events:
            if e["type"] in kinds and not e.get("_seen"):
                e["_seen"] = True
                return e
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append((kinds, fut))
        try:
            event = await asyncio.wait_for(fut, TIMEOUT)
        except asyncio.TimeoutError:
            raise AssertionError(f"no {kinds} within {TIMEOUT} s; saw {[e['type'] for e in self.events]}")
        event["_seen"] = True
        return event

    async def listen(self, track):
        while True:
            try:
                frame = await track.recv()
            except Exception:
                return
            pcm = frame.to_ndarray().astype(np.float64)
            ms = frame.samples * 1000 // frame.sample_rate
            if np.sqrt(np.mean(pcm ** 2)) > 300:
                self.loud_ms += ms
                # A frame already in flight when the clear left may still arrive.
                if self.cleared_at is not None and time.monotonic() - self.cleared_at > 0.2:
                    self.loud_after_clear_ms += ms


async def open_call(base, key, path):
    """A peer connection with a voice and the events channel, its offer posted to `path` with
    `key`: (pc, call, voice, channel, location, listeners), once the channel is open."""
    pc = RTCPeerConnection()
    call = Call()
    voice = Voice()
    pc.addTrack(voice)
    channel = pc.createDataChannel("oai-events")
    channel.on("message", call.on_event)
    opened = asyncio.get_running_loop().create_future()
    channel.on("open", lambda: opened.done() or opened.set_result(True))
    listeners = []
    pc.on("track", lambda track: listeners.append(asyncio.ensure_future(call.listen(track))))
    await pc.setLocalDescription(await pc.createOffer())
    status, headers, body = post(f"{base}{path}", pc.localDescription.sdp.encode(),
                                 {"Authorization": f"Bearer {key}", "Content-Type": "application/sdp"})
    assert status == 201, (status, body)
    location = headers.get("Location") or headers.get("location")
    await pc.setRemoteDescription(RTCSessionDescription(sdp=body.decode(), type="answer"))
    await asyncio.wait_for(opened, TIMEOUT)
    return pc, call, voice, channel, location, listeners


async def main(port, key, queued):
    base = f"http://127.0.0.1:{port}"
    out = {}
    session = {"type": "realtime", "instructions": "Be brief.",
               "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}
    status, _, body = post(f"{base}/v1/realtime/client_secrets", json.dumps({"session": session}).encode(),
                           {"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    assert status == 200, (status, body)
    secret = json.loads(body)
    assert secret["value"].startswith("ek_") and secret["expires_at"] > time.time(), secret
    out["secret_ttl_s"] = round(secret["expires_at"] - time.time())

    pc, call, voice, channel, location, listeners = await open_call(base, secret["value"], "/v1/realtime/calls")
    assert location and location.startswith("/v1/realtime/calls/rtc_"), location
    if queued:
        waiting = await call.wait("session.queued")
        assert call.events[0]["type"] == "session.queued", call.events[0]
        out["queued_position"] = waiting["position"]
        print(f"queued {waiting['position']}", flush=True)
    created = await call.wait("session.created")
    # Before session.created: the queue's events only (its track sends silence while it waits:
    # nothing is said, nothing is told).
    at = [e["type"] for e in call.events].index("session.created")
    assert all(e["type"] in ("session.queued", "session.queue_update") for e in call.events[:at]), call.events[:at]
    out["session_id"] = created["session"]["id"]
    updated = await call.wait("session.updated")
    assert updated["session"]["instructions"] == "Be brief.", updated

    # The secret was good once.
    status, _, body = post(f"{base}/v1/realtime/calls", pc.localDescription.sdp.encode(),
                           {"Authorization": f"Bearer {secret['value']}", "Content-Type": "application/sdp"})
    out["secret_reused"] = status
    out["secret_reused_says"] = json.loads(body)["error"]["message"]

    # Turn 1: speak, hear the whole answer.
    voice.speak(1.5)
    await call.wait("input_audio_buffer.speech_started")
    await call.wait("input_audio_buffer.speech_stopped")
    await call.wait("input_audio_buffer.committed")
    started = await call.wait("output_audio_buffer.started")
    done = await call.wait("response.done")
    assert done["response"]["status"] == "completed", done
    stopped = await call.wait("output_audio_buffer.stopped")
    assert stopped["response_id"] == started["response_id"], (started, stopped)
    out["turn1_heard_ms"] = call.loud_ms
    out["turn1_usage"] = done["response"].get("usage")
    deltas = [e["type"] for e in call.events if e["type"].endswith("audio.delta")]
    out["audio_deltas_on_channel"] = len(deltas)

    # Turn 2: speak, and clear the answer as soon as it plays.
    voice.speak(1.5)
    await call.wait("input_audio_buffer.speech_stopped")
    started = await call.wait("output_audio_buffer.started")
    channel.send(json.dumps({"type": "output_audio_buffer.clear", "event_id": "clear-1"}))
    call.cleared_at = time.monotonic()
    cleared = await call.wait("output_audio_buffer.cleared", "output_audio_buffer.stopped")
    out["turn2_end"] = cleared["type"]
    out["turn2_cleared_id_matches"] = cleared["response_id"] == started["response_id"]
    await call.wait("response.done")
    await asyncio.sleep(0.5)  # to hear whether anything of the cleared answer still plays
    out["loud_after_clear_ms"] = call.loud_after_clear_ms

    # Hung up as a page holding only the secret does: with the secret the call was opened with
    # (another one is answered as no such call, and counts as no wrong key).
    status, _, _ = post(f"{base}{location}/hangup", b"", {"Authorization": "Bearer ek_not-this-calls-secret"})
    out["hangup_other_secret"] = status
    status, _, body = post(f"{base}{location}/hangup", b"", {"Authorization": f"Bearer {secret['value']}"})
    assert status == 200, (status, body)
    out["hangup"] = status
    status, _, _ = post(f"{base}{location}/hangup", b"", {"Authorization": f"Bearer {key}"})
    out["hangup_again"] = status
    for listener in listeners:
        listener.cancel()
    await pc.close()
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        asyncio.run(main(int(sys.argv[1]), sys.argv[2], "--queued" in sys.argv[3:]))
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        sys.exit(1)
