"""OpenADR 2.0b, the first grid protocol: openleadr's VEN client (`ven`), the signals'
meaning in kW (`signals`) and the hardened XML parser (`xml`). Only this package imports
openleadr; the core sees `ExternalEvent`s (`gateway.services.grid`)."""

import warnings


def quiet_signxml() -> None:
    """signxml (openleadr's XML signatures) names DSA's key types at import, which
    cryptography 51 deprecates with a warning on every start of a program that imports
    openleadr; nothing here uses DSA. Called before openleadr is imported."""
    warnings.filterwarnings("ignore", message="DSA is deprecated", module="signxml")


quiet_signxml()
