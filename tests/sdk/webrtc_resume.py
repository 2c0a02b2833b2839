"""A WebRTC call to omni-gateway (aiortc) whose peer connection is replaced mid-session, as a
phone's is when it changes networks: the new one takes the session back with its resume token.

Usage: python webrtc_resume.py PORT API_KEY

1. Calls with the API key; `session.created` carries the session's `resume_token`.
2. Speaks (a tone), hears the whole answer on the track.
3. Opens a second peer connection with a new offer to /v1/realtime/calls?resume=TOKEN&received=N
   (N: the events received on the first): its data channel gets `session.resumed` for the same
   session, and the first call is hung up by the server.
4. Speaks on the second, hears the answer there; the conversation has both turns.
5. Hangs up.
Prints one JSON object with what it saw; exits 1 on a failure.
"""

import asyncio
import json
import sys

from aiortc import RTCPeerConnection
from webrtc_call import open_call, post


async def turn(call, voice):
    """Speaks and waits for the whole answer; answers the response.done."""
    voice.speak(1.5)
    await call.wait("input_audio_buffer.speech_stopped")
    await call.wait("output_audio_buffer.started")
    done = await call.wait("response.done")
    assert done["response"]["status"] == "completed", done
    await call.wait("output_audio_buffer.stopped")
    return done


async def main(port, key):
    base = f"http://127.0.0.1:{port}"
    out = {}
    pc1, first, voice1, _, location1, listeners1 = await open_call(base, key, "/v1/realtime/calls")
    created = await first.wait("session.created")
    token = created.get("resume_token")
    assert token and token.startswith("rsm_"), created
    out["session_id"] = created["session"]["id"]
    done1 = await turn(first, voice1)
    out["turn1_heard_ms"] = first.loud_ms

    # A new peer connection takes the session over (the first is still up: a phone's old
    # network that has not failed yet). What it received: the number of the last event_N (the
    # call's own events, output_audio_buffer.*, have ids that are not numbers).
    received = max(int(e["event_id"][6:]) for e in first.events if e.get("event_id", "")[6:].isdigit())
    pc2, second, voice2, _, location2, listeners2 = await open_call(
        base, key, f"/v1/realtime/calls?resume={token}&received={received}")
    resumed = await second.wait("session.resumed")
    out["resumed_session_id"] = resumed["session_id"]
    out["resumed_token_is_new"] = resumed["resume_token"] != token
    out["replayed"] = resumed["replayed"]
    # The server hung the first call up: it is no call of the key's any more.
    status, _, _ = post(f"{base}{location1}/hangup", b"", {"Authorization": f"Bearer {key}"})
    out["first_call_hangup"] = status

    done2 = await turn(second, voice2)
    out["turn2_heard_ms"] = second.loud_ms
    out["turn2_response_differs"] = done2["response"]["id"] != done1["response"]["id"]
    # The same token again is refused: it was used.
    pc3 = RTCPeerConnection()
    pc3.createDataChannel("oai-events")
    await pc3.setLocalDescription(await pc3.createOffer())
    status, _, _ = post(f"{base}/v1/realtime/calls?resume={token}", pc3.localDescription.sdp.encode(),
                        {"Authorization": f"Bearer {key}", "Content-Type": "application/sdp"})
    out["token_reused"] = status
    await pc3.close()

    status, _, body = post(f"{base}{location2}/hangup", b"", {"Authorization": f"Bearer {key}"})
    assert status == 200, (status, body)
    for listener in listeners1 + listeners2:
        listener.cancel()
    await pc1.close()
    await pc2.close()
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
    except Exception:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        sys.exit(1)
