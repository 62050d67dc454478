"""A hardened XML parser for openleadr, installed explicitly (`harden_parser()`).

openleadr 0.5.36 parses every message with one module-level lxml parser that resolves
entities and loads DTDs: an entity-expansion ("billion laughs") message crashes the process
(a segfault with lxml 6 / libxml2 2.14), and external entities would be read. flexgate's VEN
and mock VTN both install, before they start, a parser that does neither: such a message fails
schema validation and is dropped.
"""

from __future__ import annotations

from lxml import etree
from openleadr import messaging


def harden_parser() -> None:
    """Replace openleadr's XML parser with one that resolves no entity and loads no DTD."""
    messaging.XML_PARSER = etree.XMLParser(
        schema=messaging.XML_SCHEMA, resolve_entities=False, load_dtd=False, no_network=True
    )
