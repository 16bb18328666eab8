"""MLflow model registry, model bundles, pyfunc wrappers: what crosses into and out of the registry.

mlflow loads on first use of the functions in :mod:`sloctl.registry.store`,
so importing this package stays cheap.
"""
