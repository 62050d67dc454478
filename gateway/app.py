"""The gateway's composition root: `create_app(settings)`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError

from agents.protocol import validation_detail
from flexmodel.errors import FlexModelError
from gateway.api.routes import router, v1
from gateway.errors import GatewayError
from gateway.services.runtime import Gateway
from gateway.settings import GatewaySettings, get_settings
from gateway.store.db import open_engine

log = logging.getLogger("flexgate.gateway")


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = open_engine(settings.database_url)
        gateway = Gateway(settings, engine)
        app.state.gateway = gateway
        await gateway.start()
        ven = None
        if settings.vtn_url:
            from gateway.ven import Ven  # openleadr loads only when a VTN is configured

            ven = Ven(gateway)
            await ven.start()
        app.state.ven = ven
        try:
            yield
        finally:
            if ven is not None:
                await ven.stop()
            await gateway.stop()
            engine.dispose()

    app = FastAPI(
        title="flexgate gateway",
        version="0.1.0",
        lifespan=lifespan,
        description="Demand response for AI data centres: quotes, events, plans, caps.",
    )
    app.include_router(router)
    app.include_router(v1)

    @app.exception_handler(GatewayError)
    async def gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(FlexModelError)
    async def model_error(_: Request, exc: FlexModelError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(OperationalError)
    async def store_down(_: Request, exc: OperationalError) -> JSONResponse:
        log.warning("store unreachable: %s", exc.orig)
        detail = "the store is unreachable: nothing was changed; try again"
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_detail(exc.errors())}, status_code=422)

    return app
