"""``shapewatch`` and ``python -m shapewatch``: the command line, or a clear word when it is not installed.

The command line (service, analyzer, dashboard) needs the ``service`` extra; an application that
installed only the SDK gets a sentence saying what to install instead of a traceback.
"""

from __future__ import annotations

import sys

# The packages the command line cannot start without (the service extra; the dashboard extra is
# checked by `shapewatch dashboard` itself).
_SERVICE = ("click", "duckdb", "fastapi", "uvicorn", "apscheduler", "prometheus_client", "scipy")


def main() -> None:
    try:
        from shapewatch.analysis.cli import main as cli_main
    except ModuleNotFoundError as exc:
        if exc.name not in _SERVICE:
            raise
        sys.stderr.write(
            f"shapewatch: the command line needs the service extra ({exc.name} is not installed): "
            "pip install 'shapewatch[service]' (or 'shapewatch[all]' for the dashboard too)\n"
        )
        raise SystemExit(2) from None
    cli_main()


if __name__ == "__main__":
    main()
