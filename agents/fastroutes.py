"""The agent's fast-path routes (docs/fast.md): its armed plans, and a trigger over HTTP."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.concurrency import run_in_threadpool

from agents.bearer import bearer
from agents.fasttrigger import TriggerGuard
from agents.protocol import problems
from agents.protocol_fast import ArmCommand, ArmState, TriggerAnswer


def fast_router(
    resolve: Callable[..., Any], token: str, guard: TriggerGuard, prefix: str = ""
) -> APIRouter:
    """The routes under `prefix`; `resolve` is the dependency that finds the node."""
    router = APIRouter(prefix=prefix)
    here = Depends(resolve)

    @router.get("/v1/fast/armed", response_model=ArmState)
    def armed(node: Any = here) -> ArmState:
        return node.controller.arm_state()  # type: ignore[no-any-return]

    @router.put(
        "/v1/fast/armed",
        response_model=ArmState,
        dependencies=[Depends(bearer(token))],
        responses=problems(400, 401, 409, 422),
    )
    def arm(command: ArmCommand, node: Any = here) -> ArmState:
        return node.controller.arm(command)  # type: ignore[no-any-return]

    @router.post(
        "/v1/fast/trigger",
        response_model=TriggerAnswer,
        responses=problems(401, 409, 422, 502),
    )
    async def trigger(
        request: Request,
        node: Any = here,
        signature: Annotated[str | None, Header(alias="Flexgate-Signature")] = None,
    ) -> TriggerAnswer:
        received = node.controller.clock()
        checked = guard.check(await request.body(), signature, node.node_id)
        if node.backend.kind == "sim":  # microseconds: no thread hop
            results = node.controller.fire(checked, received)
        else:  # NVML blocks
            results = await run_in_threadpool(node.controller.fire, checked, received)
        applied = results is not None
        return TriggerAnswer(
            node_id=node.node_id, seq=checked.seq, applied=applied, results=results or []
        )

    return router
