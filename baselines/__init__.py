"""baselines: frozen, dated profiles of a cohort; activation per cohort, history, export and import."""

from __future__ import annotations

from .baseline import (
    BASELINES_SCHEMA,
    EARLIEST,
    LATEST,
    MAX_DOCUMENT_BYTES,
    NAME_MAX,
    Activation,
    ActivationAction,
    Baseline,
    BaselineListing,
    Cohort,
    ExportReport,
    Resolved,
    activate_baseline,
    activation_history,
    active_baseline,
    baseline_from_document,
    document_problems,
    export_baselines,
    export_documents,
    export_path,
    freeze_baseline,
    get_baseline,
    import_baseline,
    import_document,
    inherit_baseline,
    is_unpinned,
    list_baselines,
    read_document,
    resolve_baseline,
    retire_baseline,
    write_document,
)
from .errors import (
    BaselineError,
    BaselineExportIncomplete,
    BaselineInvalid,
    BaselineNotFound,
    BaselineRefused,
    BaselineTampered,
    BaselineUnreadable,
)

__all__ = [
    "BASELINES_SCHEMA", "EARLIEST", "LATEST", "MAX_DOCUMENT_BYTES", "NAME_MAX", "Activation", "ActivationAction",
    "Baseline", "BaselineError", "BaselineExportIncomplete", "BaselineInvalid", "BaselineListing", "BaselineNotFound",
    "BaselineRefused", "BaselineTampered", "BaselineUnreadable", "Cohort", "ExportReport", "Resolved",
    "activate_baseline", "activation_history", "active_baseline", "baseline_from_document", "document_problems",
    "export_baselines", "export_documents", "export_path", "freeze_baseline", "get_baseline", "import_baseline",
    "import_document", "inherit_baseline", "is_unpinned", "list_baselines", "read_document", "resolve_baseline",
    "retire_baseline", "write_document",
]
