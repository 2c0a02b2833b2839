"""Every event the gateway sent in recorded sessions, validated against the official `openai`
Python SDK's own types: GA sessions (dialect "openai") against `openai.types.realtime`, beta
ones ("openai-beta") against `openai.types.beta.realtime`. The recording replaced audio by
references; they are put back as the strings the types take.

Usage: python event_shapes.py RECORDINGS_DIR...
Prints one line per event type with its count, and every event that does not validate; exits 1
if any does not. The gateway's own events, documented and outside OpenAI's types, are counted
apart: its queue's news (session.queued, session.queue_update). The beta types allow only
OpenAI's own model names in `session.model`; a self-hosted model has its own name, which is put
in the place of one of theirs before validating (the GA types take any name).
"""

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Annotated, Union, get_args, get_origin

from pydantic import Field, TypeAdapter

OWN = {"session.queued", "session.queue_update"}


def adapter(union):
    """A validator of the SDK's union of server events (an Annotated union, discriminated by type)."""
    if get_origin(union) is Annotated:
        union = get_args(union)[0]
    return TypeAdapter(Annotated[Union[get_args(union)], Field(discriminator="type")])


def adapters():
    from openai.types.beta.realtime import RealtimeServerEvent as Beta
    from openai.types.realtime import RealtimeServerEvent as Ga

    return {"openai": adapter(Ga), "openai-beta": adapter(Beta)}


def unref(v):
    """The recording's audio and attachment references, as the strings they stood for."""
    if isinstance(v, dict):
        if "$ref" in v:
            return ""
        return {k: unref(x) for k, x in v.items()}
    if isinstance(v, list):
        return [unref(x) for x in v]
    return v


def main(dirs):
    types = adapters()
    counts, own, bad = Counter(), Counter(), []
    sessions = 0
    for d in dirs:
        for meta in sorted(Path(d).rglob("meta.json")):
            dialect = json.loads(meta.read_text()).get("dialect")
            if dialect not in types:
                continue
            sessions += 1
            for line in (meta.parent / "events.jsonl").read_text().splitlines():
                record = json.loads(line)
                event = record.get("event")
                if record.get("dir") != "out" or not isinstance(event, dict):
                    continue
                kind = event.get("type")
                if kind in OWN:
                    own[kind] += 1
                    continue
                counts[(dialect, kind)] += 1
                event = unref(event)
                if dialect == "openai-beta" and isinstance(event.get("session"), dict) and "model" in event["session"]:
                    event["session"]["model"] = "gpt-realtime"
                try:
                    types[dialect].validate_python(event)
                except Exception as e:  # pydantic's ValidationError, or a type it does not know
                    bad.append(f"{dialect} {kind}: {str(e).splitlines()[0:3]} in {json.dumps(event)[:300]}")
    for (dialect, kind), n in sorted(counts.items()):
        print(f"{dialect:12} {kind:60} {n}")
    for kind, n in sorted(own.items()):
        print(f"{'(own)':12} {kind:60} {n}")
    for b in bad[:40]:
        print("INVALID", b)
    print(f"# {sessions} sessions, {sum(counts.values())} events of {len(counts)} types, {len(bad)} invalid")
    return 1 if bad or not sessions else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
