"""The whole configuration file, parsed into one frozen :class:`SloctlConfig`.

A configuration file holds sections (``warehouse``, ``workload``, ...); the
sections themselves and the mapping helper live in :mod:`sloctl.core.config`
(so that every layer can take them); this module assembles them with the
model sections (Stage) for the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sloctl.core.config import (
    CollectConfig,
    DemoConfig,
    IconqSection,
    RegistrySection,
    RouterSection,
    ServeSection,
    WarehouseConfig,
    WorkloadConfig,
    from_mapping,
)
from sloctl.core.errors import ConfigError
from sloctl.models.stage import StageConfig

__all__ = [
    "CollectConfig",
    "DEFAULT_CONFIG_PATH",
    "DemoConfig",
    "IconqSection",
    "RegistrySection",
    "RouterSection",
    "ServeSection",
    "SloctlConfig",
    "WarehouseConfig",
    "WorkloadConfig",
    "from_mapping",
    "load_config",
]


def _default_config_path() -> Path:
    import sloctl.configs

    return Path(sloctl.configs.__file__).resolve().parent / "default.yaml"


DEFAULT_CONFIG_PATH = _default_config_path()


@dataclass(frozen=True)
class SloctlConfig:
    """All sections of a sloctl configuration file."""

    warehouse: WarehouseConfig = field(default_factory=WarehouseConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    serve: ServeSection = field(default_factory=ServeSection)
    stage: StageConfig = field(default_factory=StageConfig)
    iconq: IconqSection = field(default_factory=IconqSection)
    registry: RegistrySection = field(default_factory=RegistrySection)
    router: RouterSection = field(default_factory=RouterSection)


def load_config(path: str | Path | None = None) -> SloctlConfig:
    """Read a YAML configuration file into a :class:`SloctlConfig`.

    Args:
        path: the file; ``None`` reads ``configs/default.yaml``.

    Returns:
        The parsed, frozen configuration.

    Raises:
        ConfigError: the file is missing, is not a mapping, or has an unknown
            or mistyped key (the message names the key and the file).
    """
    import yaml

    path = Path(path) if path is not None else DEFAULT_CONFIG_PATH
    if not path.is_file():
        raise ConfigError(f"{path}: configuration file not found.")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc}).") from exc
    return from_mapping(SloctlConfig, raw, source=str(path))
