"""OpenADR 2.0b, the first grid protocol: openleadr's VEN client (`ven`), the signals'
meaning in kW (`signals`) and the hardened XML parser (`xml`). Only this package imports
openleadr; the core sees `ExternalEvent`s (`gateway.services.grid`)."""
