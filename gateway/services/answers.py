"""The nodes' answers to each plan: stored as they come, shown with the plan.

- **Record** a fan-out's acks (`record`): every node's answer is what a read of the current
  plan shows, without scanning every answer of every reconciliation. An answer that says the
  same as the node's last stored one (a lease renewal) is not stored again: 10,000 nodes
  renewed every 15 s would add 58 million rows a day.
- **Show** a stored plan with each node's last answer (`doc`), and as the API answers it
  (`json`): rounded JSON built once per fan-out for the current plan (thousands of nodes'
  caps and answers), and once for a superseded one, whose answers are final.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.agentclient import Ack
from gateway.errors import NotFoundError
from gateway.store import repo
from gateway.store.db import Store
from gateway.store.models import iso
from gateway.units import rounded

#: Plans kept as answered (`PlanAnswers.json`) before the cache starts over.
PLANS_KEPT = 8
#: The answers version of a superseded plan: no fan-out changes them any more.
FINAL = -1
#: A node's answer before its first one.
NO_ANSWER: dict[str, Any] = {
    "status": "pending",
    "generation": None,
    "attempts": None,
    "sent_at": None,
    "acked_at": None,
    "delay_s": None,
    "error": None,
    "enforced": [],
}


class PlanAnswers:
    def __init__(self, store: Store) -> None:
        self.store = store
        #: (plan id, each node's answer to its last fan-out, as stored)
        self._latest: tuple[str, list[dict[str, Any]]] | None = None
        self._version = 0  #: rises with every fan-out's answers
        #: (plan id, node id -> what its last stored answer said)
        self._said: tuple[str, dict[str, tuple[Any, ...]]] | None = None
        #: plan id -> (answers version, or FINAL once superseded; its JSON as answered)
        self._json: dict[str, tuple[int, str]] = {}

    def record(self, plan_id: str, generation: int, acks: list[Ack]) -> None:
        """One fan-out's acks for `plan_id`; what changed is stored (the store's errors pass:
        the answers are shown all the same)."""
        rows = [_row(plan_id, generation, ack) for ack in acks]
        self._latest = (plan_id, rows)
        self._version += 1
        if self._said is None or self._said[0] != plan_id:
            self._said = (plan_id, {})
        said = self._said[1]
        new = [r for r in rows if said.get(r["node"]) != _substance(r)]
        with self.store.session() as s:
            repo.add_commands(s, commands=new)
            s.commit()
        said.update((r["node"], _substance(r)) for r in new)

    def json(self, plan_id: str, *, current: bool) -> str:
        """`doc` rounded, in JSON; built again only when a fan-out answered the current plan."""
        version = self._version if current else FINAL
        kept = self._json.get(plan_id)
        if kept is None or kept[0] != version:
            if len(self._json) >= PLANS_KEPT:
                self._json.clear()
            kept = (version, dumps(rounded(self.doc(plan_id))))
            self._json[plan_id] = kept
        return kept[1]

    def doc(self, plan_id: str) -> dict[str, Any]:
        """The plan as stored (what it was expected to achieve is `expected_facility_kw`), with
        each node's last answer."""
        with self.store.session() as s:
            row = repo.get_plan(s, plan_id=plan_id)
            if row is None:
                raise NotFoundError(f"no plan '{plan_id}'")
            if self._latest is not None and self._latest[0] == plan_id:
                commands = self._latest[1]
            else:
                commands = [c.model_dump() for c in repo.latest_commands(s, plan_id=plan_id)]
        latest = {
            c["node"]: {
                "node": c["node"],
                "status": c["status"],
                "generation": c["generation"],
                "attempts": c["attempts"],
                "sent_at": iso(c["sent_at"]),
                "acked_at": iso(c["acked_at"]),
                "delay_s": c["delay_s"],
                "error": c["error"],
                "enforced": [
                    {"gpu": r["gpu"], "enforced_w": r["enforced_w"], "clamped": r["clamped"]}
                    for r in (c["answer"] or {}).get("results", [])
                ],
            }
            for c in commands
        }
        stored = {k: v for k, v in row.doc.items() if k != "achieved_facility_kw"}
        return {
            **stored,
            "id": row.id,
            "event_id": row.event_id,
            "generation": row.generation,
            "expected_facility_kw": row.doc["achieved_facility_kw"],
            # Per node: the caps sent, and the last answer (status, timings).
            "commands": [
                {**command, **latest.get(command["node"], NO_ANSWER)}
                for command in row.doc["commands"]
            ],
            "created_at": iso(row.created_at),
        }


def _row(plan_id: str, generation: int, ack: Ack) -> dict[str, Any]:
    return {
        "plan_id": plan_id,
        "node": ack.node,
        "generation": generation,
        "status": ack.status,
        "attempts": ack.attempts,
        "sent_at": ack.sent_at,
        "acked_at": ack.acked_at,
        "delay_s": ack.delay_s,
        "error": ack.error,
        "answer": ack.answer.model_dump() if ack.answer else None,
    }


def _substance(row: dict[str, Any]) -> tuple[Any, ...]:
    """What an answer says, without when: its generation, status, attempts, error and each
    GPU's result (the limit read back, clamped, error)."""
    results = (row["answer"] or {}).get("results", [])
    return (
        row["generation"],
        row["status"],
        row["attempts"],
        row["error"],
        tuple((r["gpu"], r["enforced_w"], r["clamped"], r["error"]) for r in results),
    )


def dumps(doc: dict[str, Any]) -> str:
    """JSON as the API answers it (no NaN or infinity)."""
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)
