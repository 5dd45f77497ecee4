"""collector: observations. The envelope, provider adapters, flattening, the DuckDB
store (schema, migrations, the one writer), idempotent ingest, rollups, the
ingest HTTP routes, bulk import and the SDK. It knows nothing of baselines or
alerts."""

from .adapters import AdaptedResponse, AdapterError, OutcomeKind, Provider, ProviderOutcome, adapt_response
from .api import ApiError, CollectorApi, error_body, install_error_handlers, require_token
from .envelope import Envelope, Limits, limits_from_settings, parse_body, parse_envelope, validate_envelope
from .errors import (EnvelopeInvalid, FieldError, SettingsInvalid, ShapewatchError, StoreError, StoreLocked,
                     StoreUnavailable, StoreVersionTooNew)
from .flatten import JsonType, Observation, flatten_output
from .ingest import ImportSummary, import_files, quarantine_path
from .metrics import CollectorMetrics
from .rollup import RollupConfig
from .sdk import Client
from .settings import Settings, load_settings, settings_help
from .store import SCHEMA_VERSION, Store, WriteResult, WriteStatus
from .writer import Writer

__all__ = [
    "AdaptedResponse", "AdapterError", "ApiError", "Client", "CollectorApi", "CollectorMetrics", "Envelope",
    "EnvelopeInvalid", "FieldError", "ImportSummary", "JsonType", "Limits", "Observation", "OutcomeKind",
    "Provider", "ProviderOutcome", "RollupConfig", "SCHEMA_VERSION", "Settings", "SettingsInvalid",
    "ShapewatchError", "Store", "StoreError", "StoreLocked", "StoreUnavailable", "StoreVersionTooNew",
    "WriteResult", "WriteStatus", "Writer", "adapt_response", "error_body", "flatten_output", "import_files",
    "install_error_handlers", "limits_from_settings", "load_settings", "parse_body", "parse_envelope",
    "quarantine_path", "require_token", "settings_help", "validate_envelope",
]
