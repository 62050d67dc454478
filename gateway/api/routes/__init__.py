"""The gateway's HTTP API, one module per resource. Routes stay thin: they call services."""

from gateway.api.routes import (
    characterise,
    dashboard,
    events,
    fast,
    health,
    jobs,
    plans,
    predictor,
    quotes,
    site,
)

routers = [
    health.router,
    site.router,
    jobs.router,
    characterise.router,
    predictor.router,
    quotes.router,
    events.router,
    plans.router,
    fast.router,
    dashboard.router,
]
