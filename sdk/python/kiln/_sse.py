"""A Server-Sent Events parser (the WHATWG event-stream format) over a line source."""
from __future__ import annotations

import json
from typing import Callable, Iterator, Optional

from .types import Event


def parse(readline: Callable[[], bytes]) -> Iterator[Event]:
    """Yield the events of a stream read line by line; ends at end of stream.

    An event without a data line is not dispatched (as the format says); a
    data payload that is not JSON is given as a string.
    """
    etype, data, eid = "", [], None
    while True:
        line = readline()
        if not line:
            return
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if text == "":
            if data:
                payload = "\n".join(data)
                try:
                    value = json.loads(payload)
                except (ValueError, RecursionError):
                    value = payload
                yield Event(type=etype or "message", data=value, id=eid)
            etype, data = "", []
            continue
        if text.startswith(":"):
            continue  # a comment, e.g. a keep-alive
        name, _, value = text.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            etype = value
        elif name == "data":
            data.append(value)
        elif name == "id":
            if "\0" not in value:
                eid = value
        # "retry" and unknown fields are ignored: reconnection is paced by the client's policy.


def last_id(current: Optional[str], ev: Event) -> Optional[str]:
    return ev.id if ev.id is not None else current
