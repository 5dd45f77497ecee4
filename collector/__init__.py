"""collector: observations. The envelope, provider adapters, flattening, the DuckDB
store (schema, migrations, the one writer), idempotent ingest, rollups, the
ingest HTTP routes, bulk import and the SDK. It knows nothing of baselines or
alerts.

Names are loaded on first use (PEP 562), so a command that only imports files
does not pay for the web framework, and an application using the SDK does
not pay for DuckDB.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "AdaptedResponse": "adapters",
    "AdapterError": "adapters",
    "OutcomeKind": "adapters",
    "Provider": "adapters",
    "ProviderOutcome": "adapters",
    "adapt_response": "adapters",
    "ApiError": "api",
    "CollectorApi": "api",
    "error_body": "api",
    "install_error_handlers": "api",
    "require_token": "api",
    "TokenGuard": "api",
    "error_responses": "api",
    "Envelope": "envelope",
    "Limits": "envelope",
    "limits_from_settings": "envelope",
    "parse_body": "envelope",
    "parse_envelope": "envelope",
    "validate_envelope": "envelope",
    "EnvelopeInvalid": "errors",
    "FieldError": "errors",
    "SettingsInvalid": "errors",
    "ShapewatchError": "errors",
    "StoreError": "errors",
    "StoreInvalidated": "errors",
    "StoreLocked": "errors",
    "StoreUnavailable": "errors",
    "StoreVersionTooNew": "errors",
    "JsonType": "flatten",
    "Observation": "flatten",
    "flatten_output": "flatten",
    "ImportSummary": "ingest",
    "import_files": "ingest",
    "quarantine_path": "ingest",
    "CollectorMetrics": "metrics",
    "UncheckedOutputs": "metrics",
    "BodyLimits": "http_policy",
    "BodyPolicy": "http_policy",
    "BodyRefused": "http_policy",
    "guarded_protocol": "http_policy",
    "FieldProfile": "profile",
    "Profile": "profile",
    "read_profile": "profile",
    "read_profiles": "profile",
    "served_aliases": "profile",
    "contract_changes": "profile",
    "RollupConfig": "rollup",
    "Client": "sdk",
    "parse_retry_after": "sdk",
    "Settings": "settings",
    "load_settings": "settings",
    "settings_help": "settings",
    "Scope": "settings",
    "TokenEntry": "settings",
    "parse_token": "settings",
    "tag_problem": "envelope",
    "SCHEMA_VERSION": "store",
    "Schema": "store",
    "Store": "store",
    "WriteResult": "store",
    "WriteStatus": "store",
    "Writer": "writer",
    # contracts: reading, fingerprints, the registry and validation; diffs
    "ContractConflict": "errors",
    "ContractError": "errors",
    "ContractInvalid": "errors",
    "ContractNotFound": "errors",
    "ContractToolAmbiguous": "errors",
    "Contract": "contracts",
    "ContractValidator": "contracts",
    "RegisteredContract": "contracts",
    "SchemaFacts": "contracts",
    "Tool": "contracts",
    "ToolFormat": "contracts",
    "ValidatorCache": "contracts",
    "Violation": "contracts",
    "contract_from_document": "contracts",
    "declared_facts": "contracts",
    "get_contract": "contracts",
    "list_contracts": "contracts",
    "normalize_schema": "contracts",
    "parse_contract": "contracts",
    "read_contract": "contracts",
    "register_contract": "contracts",
    "ChangeKind": "contract_diff",
    "Classification": "contract_diff",
    "ContractChange": "contract_diff",
    "Verdict": "contract_diff",
    "diff_contracts": "contract_diff",
    "diff_exit_code": "contract_diff",
    "diff_verdict": "contract_diff",
}

__all__ = [
    "SCHEMA_VERSION",
    "AdaptedResponse",
    "AdapterError",
    "ApiError",
    "BodyLimits",
    "BodyPolicy",
    "BodyRefused",
    "ChangeKind",
    "Classification",
    "Client",
    "CollectorApi",
    "CollectorMetrics",
    "Contract",
    "ContractChange",
    "ContractConflict",
    "ContractError",
    "ContractInvalid",
    "ContractNotFound",
    "ContractToolAmbiguous",
    "ContractValidator",
    "Envelope",
    "EnvelopeInvalid",
    "FieldError",
    "FieldProfile",
    "ImportSummary",
    "JsonType",
    "Limits",
    "Observation",
    "OutcomeKind",
    "Profile",
    "Provider",
    "ProviderOutcome",
    "RegisteredContract",
    "RollupConfig",
    "Schema",
    "SchemaFacts",
    "Scope",
    "Settings",
    "SettingsInvalid",
    "ShapewatchError",
    "Store",
    "StoreError",
    "StoreInvalidated",
    "StoreLocked",
    "StoreUnavailable",
    "StoreVersionTooNew",
    "TokenEntry",
    "TokenGuard",
    "Tool",
    "ToolFormat",
    "UncheckedOutputs",
    "ValidatorCache",
    "Verdict",
    "Violation",
    "WriteResult",
    "WriteStatus",
    "Writer",
    "adapt_response",
    "contract_changes",
    "contract_from_document",
    "declared_facts",
    "diff_contracts",
    "diff_exit_code",
    "diff_verdict",
    "error_body",
    "error_responses",
    "flatten_output",
    "get_contract",
    "guarded_protocol",
    "import_files",
    "install_error_handlers",
    "limits_from_settings",
    "list_contracts",
    "load_settings",
    "normalize_schema",
    "parse_body",
    "parse_contract",
    "parse_envelope",
    "parse_retry_after",
    "parse_token",
    "quarantine_path",
    "read_contract",
    "read_profile",
    "read_profiles",
    "register_contract",
    "require_token",
    "served_aliases",
    "settings_help",
    "tag_problem",
    "validate_envelope",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'collector' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from .adapters import (
        AdaptedResponse,
        AdapterError,
        OutcomeKind,
        Provider,
        ProviderOutcome,
        adapt_response,
    )
    from .api import (
        ApiError,
        CollectorApi,
        TokenGuard,
        error_body,
        error_responses,
        install_error_handlers,
        require_token,
    )
    from .contract_diff import (
        ChangeKind,
        Classification,
        ContractChange,
        Verdict,
        diff_contracts,
        diff_exit_code,
        diff_verdict,
    )
    from .contracts import (
        Contract,
        ContractValidator,
        RegisteredContract,
        SchemaFacts,
        Tool,
        ToolFormat,
        ValidatorCache,
        Violation,
        contract_from_document,
        declared_facts,
        get_contract,
        list_contracts,
        normalize_schema,
        parse_contract,
        read_contract,
        register_contract,
    )
    from .envelope import (
        Envelope,
        Limits,
        limits_from_settings,
        parse_body,
        parse_envelope,
        tag_problem,
        validate_envelope,
    )
    from .errors import (
        ContractConflict,
        ContractError,
        ContractInvalid,
        ContractNotFound,
        ContractToolAmbiguous,
        EnvelopeInvalid,
        FieldError,
        SettingsInvalid,
        ShapewatchError,
        StoreError,
        StoreInvalidated,
        StoreLocked,
        StoreUnavailable,
        StoreVersionTooNew,
    )
    from .flatten import JsonType, Observation, flatten_output
    from .http_policy import BodyLimits, BodyPolicy, BodyRefused, guarded_protocol
    from .ingest import ImportSummary, import_files, quarantine_path
    from .metrics import CollectorMetrics, UncheckedOutputs
    from .profile import FieldProfile, Profile, contract_changes, read_profile, read_profiles, served_aliases
    from .rollup import RollupConfig
    from .sdk import Client, parse_retry_after
    from .settings import Scope, Settings, TokenEntry, load_settings, parse_token, settings_help
    from .store import SCHEMA_VERSION, Schema, Store, WriteResult, WriteStatus
    from .writer import Writer
