"""The facility meter: sources behind one interface (sources), and the sampling feed (feed)."""

from gateway.meter.feed import MeterFeed, MeterState, Reading
from gateway.meter.sources import Meter, open_meter

__all__ = ["Meter", "MeterFeed", "MeterState", "Reading", "open_meter"]
