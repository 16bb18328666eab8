"""YAML configuration files shipped with sloctl (``default.yaml``)."""
