"""baselines: frozen, dated profiles of a cohort; activation per cohort, history, export and import."""

from __future__ import annotations

from .baseline import (
    BASELINES_SCHEMA,
    Activation,
    ActivationAction,
    Baseline,
    BaselineListing,
    Cohort,
    Resolved,
    activate_baseline,
    activation_history,
    active_baseline,
    baseline_from_document,
    export_baselines,
    export_path,
    freeze_baseline,
    get_baseline,
    import_baseline,
    import_document,
    inherit_baseline,
    is_unpinned,
    list_baselines,
    resolve_baseline,
    retire_baseline,
    write_document,
)
from .errors import BaselineError, BaselineNotFound, BaselineRefused, BaselineTampered

__all__ = [
    "BASELINES_SCHEMA", "Activation", "ActivationAction", "Baseline", "BaselineError", "BaselineListing",
    "BaselineNotFound", "BaselineRefused", "BaselineTampered", "Cohort", "Resolved", "activate_baseline",
    "activation_history", "active_baseline", "baseline_from_document", "export_baselines", "export_path", "freeze_baseline",
    "get_baseline", "import_baseline", "import_document", "inherit_baseline", "is_unpinned", "list_baselines", "resolve_baseline",
    "retire_baseline", "write_document",
]
