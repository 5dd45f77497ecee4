"""shapewatch: a schema-drift monitor for language-model structured outputs.

The one import name the distribution installs. Applications record outputs with the SDK::

    from shapewatch import Client

The parts of the service live below it: ``shapewatch.collector`` (envelope, store, ingest, SDK),
``shapewatch.baselines``, ``shapewatch.analysis`` (analyzer, alerts, HTTP service, CLI) and
``shapewatch.dashboard``. In the repository they are the top-level folders of the same names;
``shapewatch/`` links to them (docs/architecture.md, *Layout*).

``Client`` is loaded on first use, so ``import shapewatch`` costs nothing beyond the standard library.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shapewatch.collector.sdk import Client

try:
    __version__ = metadata.version("shapewatch")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from shapewatch.collector.sdk import Client

        return Client
    raise AttributeError(f"module 'shapewatch' has no attribute {name!r}")
