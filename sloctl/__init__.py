"""sloctl: learn how a service fleet behaves under load, then control it.

The package is one namespace mapped onto the repository's top-level folders:
``sloctl.datasets`` (logs, workloads, features), ``sloctl.control`` (policies
and the interfaces they drive), ``sloctl.configs`` (YAML defaults), and more
as the project grows. Importing ``sloctl`` is cheap: heavy libraries load
inside the functions that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
