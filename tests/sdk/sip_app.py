"""An app that answers SIP calls the way OpenAI's SIP guide has it, written with the official
openai SDK, pointed at the gateway: it takes `realtime.call.incoming` on a webhook (checked by
`client.webhooks.unwrap`), and accepts, rejects or ignores the call by the number called.
Used by tests/it/sip.rs.

    sip_app.py API_KEY WEBHOOK_SECRET

Prints `listening PORT` (its webhook's port) and reads the gateway's port on stdin; then prints
one line per thing it did:
`incoming CALL_ID TO`, `accepted CALL_ID`, `rejected CALL_ID`, `ignored CALL_ID`. Reads commands
on stdin: `tools CALL_ID` (opens the call's WebSocket with `client.realtime.connect(call_id=)`,
asks by text for the time, answers the model's call of `get_time` with "noon", prints
`tool-answer TRANSCRIPT`, then reads on until the socket closes with the call: `sideband closed`),
`second CALL_ID` (another socket on the call while the first is on: prints `second closed CODE
REASON`), `otherkey CALL_ID` (a socket with another key of the gateway's: prints `otherkey
refused STATUS`), `hangup CALL_ID` (prints `hung-up CALL_ID`), `strangers CALL_ID` (an unknown call and a
wrong key, each refused as the SDK's errors: prints `strangers refused`), `bad CALL_ID` (an
accept of a model not served, and one with a voice speed out of range, each refused: prints
`bad refused`).
"""

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import websockets.exceptions

key, secret = sys.argv[1], sys.argv[2]
other_key = sys.argv[3] if len(sys.argv) > 3 else None
client = None
base = None


def say(line):
    print(line, flush=True)


def header(event, name):
    for h in event.data.sip_headers:
        if h.name.lower() == name.lower():
            return h.value
    return ""


def decide(event):
    call_id = event.data.call_id
    to = header(event, "To")
    say(f"incoming {call_id} {to}")
    if "sip:100@" in to:
        client.realtime.calls.accept(
            call_id,
            type="realtime",
            model="gpt-realtime",
            instructions="You answer the phone for Example Inc.",
            audio={"output": {"voice": "marin"}},
            tools=[{"type": "function", "name": "get_time", "description": "The time now.",
                    "parameters": {"type": "object", "properties": {}}}],
        )
        say(f"accepted {call_id}")
    elif "sip:200@" in to:
        client.realtime.calls.reject(call_id, status_code=486)
        say(f"rejected {call_id}")
    else:
        say(f"ignored {call_id}")


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            event = client.webhooks.unwrap(body, dict(self.headers.items()))
        except Exception as e:  # a delivery not signed with the secret
            say(f"bad-signature {e!r}")
            self.send_response(400)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        if event.type == "realtime.call.incoming":
            # Decided after the webhook is answered, as an app does.
            threading.Thread(target=decide, args=(event,), daemon=True).start()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
threading.Thread(target=server.serve_forever, daemon=True).start()
say(f"listening {server.server_address[1]}")
base = f"http://127.0.0.1:{sys.stdin.readline().strip()}/v1"
client = openai.OpenAI(api_key=key, base_url=base, webhook_secret=secret)
say("ready")

def sideband(call_id):
    with client.realtime.connect(call_id=call_id) as conn:
        conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What time is it? Use get_time."}],
        })
        conn.response.create()
        answered = False
        for event in conn:
            if event.type == "response.function_call_arguments.done" and event.name == "get_time":
                conn.conversation.item.create(item={
                    "type": "function_call_output", "call_id": event.call_id, "output": "noon",
                })
                conn.response.create()
            elif event.type == "response.output_audio_transcript.done" and not answered and "noon" in event.transcript:
                answered = True
                say(f"tool-answer {event.transcript}")
    say("sideband closed")


for line in sys.stdin:
    command, _, call_id = line.strip().partition(" ")
    if command == "tools":
        threading.Thread(target=sideband, args=(call_id,), daemon=True).start()
    elif command == "second":
        try:
            with client.realtime.connect(call_id=call_id) as conn:
                conn.recv()
            say("second: it was not closed")
        except websockets.exceptions.ConnectionClosed as e:
            say(f"second closed {e.rcvd.code} {e.rcvd.reason}")
    elif command == "otherkey":
        other = openai.OpenAI(api_key=other_key, base_url=base)
        try:
            with other.realtime.connect(call_id=call_id) as conn:
                conn.recv()
            say("otherkey: it was let on")
        except websockets.exceptions.InvalidStatus as e:
            say(f"otherkey refused {e.response.status_code}")
    elif command == "hangup":
        client.realtime.calls.hangup(call_id)
        say(f"hung-up {call_id}")
    elif command == "bad":
        refused = 0
        for settings in ({"model": "no-such-model"}, {"model": "gpt-realtime", "audio": {"output": {"speed": 9}}}):
            try:
                client.realtime.calls.accept(call_id, type="realtime", **settings)
                say(f"bad: {settings} was accepted")
            except openai.BadRequestError as e:
                refused += 1
                say(f"bad-why {e.message}")
        if refused == 2:
            say("bad refused")
    elif command == "strangers":
        try:
            client.realtime.calls.accept("rtc_nosuchcall", type="realtime")
            say("strangers: an unknown call was accepted")
        except openai.NotFoundError:
            pass
        stranger = openai.OpenAI(api_key="not-a-key-of-this-gateway", base_url=base)
        try:
            stranger.realtime.calls.reject(call_id)
            say("strangers: a wrong key rejected a call")
        except openai.AuthenticationError:
            say("strangers refused")
