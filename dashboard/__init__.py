"""The Streamlit dashboard (``dashboard/app.py``): pages and charts over the service's HTTP API.

It is a client of the service and nothing else: it imports none of the backend
packages and never opens the database file. ``shapewatch dashboard --url URL``
runs it; ``shapewatch up`` runs it beside the service.
"""

from .client import ApiClient, AuthRejected, DashboardError, RequestRefused, ServiceFailed, ServiceUnreachable
from .settings import DashboardSettings, load_settings

__all__ = [
    "ApiClient",
    "AuthRejected",
    "DashboardError",
    "DashboardSettings",
    "RequestRefused",
    "ServiceFailed",
    "ServiceUnreachable",
    "load_settings",
]
