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
    StateSection,
    WarehouseConfig,
    WorkloadConfig,
    from_mapping,
)
from sloctl.core.errors import ConfigError
from sloctl.models.stage import StageConfig

__all__ = [
    "CollectConfig",
    "DEFAULT_CONFIG_PATH",
    "PACKAGED_NETWORKS_DIR",
    "DemoConfig",
    "IconqSection",
    "RegistrySection",
    "RouterSection",
    "ServeSection",
    "SloctlConfig",
    "StateSection",
    "WarehouseConfig",
    "WorkloadConfig",
    "from_mapping",
    "load_config",
    "resolve_network_path",
]


def _default_config_path() -> Path:
    import sloctl.configs

    return Path(sloctl.configs.__file__).resolve().parent / "default.yaml"


DEFAULT_CONFIG_PATH = _default_config_path()
#: The example networks shipped with sloctl (``configs/networks/*.yaml`` in the checkout).
PACKAGED_NETWORKS_DIR = DEFAULT_CONFIG_PATH.parent / "networks"


def resolve_network_path(path: str | Path) -> tuple[Path, bool]:
    """The network file ``path`` names, falling back on the copy shipped with sloctl.

    A path that exists relative to the working folder wins. Otherwise a bare
    name (``hotel`` or ``hotel.yaml``) or the path the README uses
    (``configs/networks/hotel.yaml``) resolves to the packaged example, so the
    documented commands work after ``pip install`` outside the checkout.

    Args:
        path: what the user passed to ``--network``.

    Returns:
        ``(path to read, True when it is the packaged copy)``; a name that
        matches nothing comes back unchanged (the loader then says it is missing).
    """
    given = Path(path)
    if given.is_file():
        return given, False
    parts = given.parts
    bare = len(parts) == 1
    documented = not given.is_absolute() and parts[-3:-1] == ("configs", "networks")
    if bare or documented:
        name = given.name if given.suffix in (".yaml", ".yml") else f"{given.name}.yaml"
        packaged = PACKAGED_NETWORKS_DIR / name
        if packaged.is_file():
            return packaged, True
    return given, False


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
    state: StateSection = field(default_factory=StateSection)


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
