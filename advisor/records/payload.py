"""The base of every typed event payload: a checked record that travels as an ``Event``'s ``data``.

``advisor/records/events.py`` holds the payloads and the table by event name; the apply outcomes
(``results.py``) are payloads too.
"""

from __future__ import annotations

from typing import ClassVar, TypeVar

from advisor.records.jsonable import Checked
from advisor.records.samples import Event

P = TypeVar("P", bound="Payload")


class Payload(Checked):
    """A checked record sent as ``Event(name=NAME, data=payload.to_dict())``."""

    NAME: ClassVar[str]

    @classmethod
    def of(cls: type[P], event: Event) -> P:
        """This kind's payload of ``event``, decoded once and then kept with the event (``ValueError``
        when the event has another name or its data does not fit)."""
        if event.name != cls.NAME:
            raise ValueError(f"a {event.name!r} event has no {cls.NAME!r} payload")
        cached = event.__dict__.get("_payload")
        if isinstance(cached, cls):
            return cached
        value = cls.from_dict(event.data)
        object.__setattr__(event, "_payload", value)  # frozen: kept beside the fields, never serialised
        return value

    def event(self, *, rank: int = 0, step: int | None = None) -> Event:
        return Event(rank=rank, step=step, name=self.NAME, data=self.to_dict())
