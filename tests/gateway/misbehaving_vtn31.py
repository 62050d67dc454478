"""The lab's 3.1 mock VTN made to misbehave as a real one may: tests only, not shipped."""

from __future__ import annotations

from typing import Any

from flexgate.lab.mockvtn31 import MockVtn31


class MisbehavingVtn31(MockVtn31):
    def revoke_tokens(self) -> None:
        """Forget every token granted: each is refused from now on, lifetime or not."""
        self._tokens.clear()

    def add_raw_event(self, body: dict[str, Any]) -> dict[str, Any]:
        """Store an event as given, unchecked: a VTN sending what the specification forbids."""
        with self._lock:
            event = {**body, "id": body.get("id", str(next(self._ids)))}
            event.setdefault("objectType", "EVENT")
            self.events[str(event["id"])] = event
        self._notify("EVENT", "CREATE", event)
        return event
