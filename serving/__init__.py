"""Live serving: the control policies driving real DuckDB clusters (see :mod:`sloctl.serving.live`)."""
