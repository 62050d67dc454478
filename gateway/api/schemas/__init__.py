"""Request bodies and answers of the gateway API (docs/gateway.md, "API"), one module per
resource as the routes are; the two bases here."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictBody(BaseModel):
    """A request body: no field it does not name, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OpenAnswer(BaseModel):
    """A response: the documented fields, and any the model adds later."""

    model_config = ConfigDict(extra="allow")
