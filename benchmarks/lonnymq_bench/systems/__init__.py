"""The benchmarked systems, one adapter module each, imported only when selected (the peers'
packages are optional: ``pip install -r benchmarks/requirements.txt``)."""

from __future__ import annotations

import importlib

from .base import Flat, System, Variant

#: name -> (module, class), in the order results are shown.
REGISTRY: dict[str, tuple[str, str]] = {
    "lonnymq": ("lonnymq", "LonnyMQ"),
    "pgmq": ("pgmq", "Pgmq"),
    "pgqueuer": ("pgqueuer", "PgQueuer"),
    "seed": ("seed", "Seed"),
    "floor": ("floor", "Floor"),
    "leasefloor": ("lease_floor", "LeaseFloor"),
}

#: References only the producers benchmark (benchmarks/producers.py) runs, not the suite.
PRODUCERS_ONLY: dict[str, tuple[str, str]] = {
    "sendfloor": ("send_floor", "SendFloor"),
    "popfloor": ("pop_floor", "PopFloor"),
    "apisendfloor": ("api_floor", "ApiSendFloor"),
    "apipopfloor": ("api_floor", "ApiPopFloor"),
    "apipopfloor2": ("api_floor", "ApiPopFloor2"),
    "leasememfloor": ("lease_floor", "LeaseFloorSettled"),
    "leasestorefloor": ("lease_store_floor", "LeaseStoreFloor"),
    "apileasefloor": ("api_floor", "ApiLeaseFloor"),
    "guaranteefloor": ("api_floor", "GuaranteeFloor"),
}


def load(name: str) -> System:
    module, cls = REGISTRY[name] if name in REGISTRY else PRODUCERS_ONLY[name]
    mod = importlib.import_module(f"{__name__}.{module}")
    system: System = getattr(mod, cls)()
    return system


__all__ = ["PRODUCERS_ONLY", "REGISTRY", "Flat", "System", "Variant", "load"]
