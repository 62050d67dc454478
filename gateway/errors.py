"""The gateway's exception tree; each class carries the HTTP status it answers with.

GatewayError (500)
├── UnauthorizedError (401)
├── NotFoundError (404)
├── ConflictError (409)           e.g. cancelling an event that has ended
├── InvalidRequestError (422)     a body the model refuses (a job mix, a reduction ...)
├── StoreVersionError (500)       the database was made by another schema version
├── MeterError (503)              the facility meter gave no reading (gateway.meter)
└── JobSourceError (503)          the scheduler gave no usable answer (gateway.jobsource)
"""

from __future__ import annotations


class GatewayError(Exception):
    status_code = 500


class UnauthorizedError(GatewayError):
    status_code = 401


class NotFoundError(GatewayError):
    status_code = 404


class ConflictError(GatewayError):
    status_code = 409


class InvalidRequestError(GatewayError):
    status_code = 422


class StoreVersionError(GatewayError):
    pass


class MeterError(GatewayError):
    status_code = 503


class JobSourceError(GatewayError):
    status_code = 503
