"""Event stores: the only layer that touches disk or databases.

``jsonl`` (default, one file per session), ``sqlite`` (one database per home, many processes)
and ``postgres`` (shared by hosts of a fleet) implement :class:`EventStore`.
"""

from .base import (
    FORMAT_VERSION,
    EventStore,
    RepairReport,
    SessionHeader,
    default_home,
    store_from_settings,
)
from .jsonl import JsonlStore

__all__ = [
    "FORMAT_VERSION",
    "EventStore",
    "JsonlStore",
    "RepairReport",
    "SessionHeader",
    "default_home",
    "store_from_settings",
]
