"""Check that sloctl's layers import only downwards (docs/architecture.md).

Reads every ``import`` in the library, including those inside functions, and
maps each module onto its layer by its top-level folder. A module may import
its own layer or a layer below it; two layers on the same level (``models`` and
``control``; ``serving`` and ``training``) never import each other, nor do
the two front doors (``serving/runtime/`` and ``serving/gateway/``). Exit 1 and
one line per offending import when a rule is broken; ``--graph`` prints the
folder-to-folder edges that exist today.

Usage: python tools/check_layers.py [--graph] [ROOT]
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

# Lowest first. Folders on one level must not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("core",),
    ("datasets",),
    ("models", "control"),
    ("registry",),
    ("simulation",),
    ("training", "serving"),
    ("experiments",),
    ("sloctl",),
]
LEVEL = {folder: i for i, level in enumerate(LAYERS) for folder in level}
# `sloctl.configs` holds YAML data only; any layer may read it.
DATA_PACKAGES = {"configs"}
# Imports allowed against the rules, as (importing module, imported module); each step of the
# layering work removes some. Goal: empty.
EXCEPTIONS: set[tuple[str, str]] = set()
# Packages inside one layer that must not import each other: the two front doors over
# `sloctl.serving.controller` (docs/architecture.md).
APART: list[tuple[str, ...]] = [("sloctl.serving.runtime", "sloctl.serving.gateway")]


def _package_of(module: str, group: tuple[str, ...]) -> str | None:
    return next((p for p in group if module == p or module.startswith(p + ".")), None)


def _folder_of(module: str) -> str | None:
    """``sloctl.models.stage`` -> ``models``; ``sloctl.cli`` -> ``sloctl``."""
    parts = module.split(".")
    if parts[0] != "sloctl":
        return None
    if len(parts) == 1:
        return "sloctl"
    return parts[1] if parts[1] in LEVEL or parts[1] in DATA_PACKAGES else "sloctl"


def _module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts and parts[0] == "sloctl":
        return ".".join(parts)
    return ".".join(["sloctl", *parts])


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "sloctl":  # `from sloctl import models` names subpackages
                out.extend((node.lineno, f"sloctl.{alias.name}") for alias in node.names)
            else:
                out.append((node.lineno, target))
    return out


def scan(root: Path) -> tuple[list[str], dict[tuple[str, str], int]]:
    """Return (violations, folder edges with counts)."""
    violations: list[str] = []
    edges: dict[tuple[str, str], int] = defaultdict(int)
    folders = [*LEVEL, *DATA_PACKAGES]
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")) if (root / folder).is_dir() else []:
            module = _module_name(root, path)
            src_folder = _folder_of(module)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for lineno, target in _imports(tree, module, path.name == "__init__.py"):
                dst_folder = _folder_of(target)
                for group in APART:
                    mine, theirs = _package_of(module, group), _package_of(target, group)
                    if mine and theirs and mine != theirs:
                        violations.append(f"{path.relative_to(root)}:{lineno}: {mine} imports {target}: "
                                          f"{' and '.join(group)} never import each other")
                if dst_folder is None or dst_folder == src_folder:
                    continue
                edges[(src_folder, dst_folder)] += 1
                if dst_folder in DATA_PACKAGES or (module, target) in EXCEPTIONS:
                    continue
                if src_folder in DATA_PACKAGES or LEVEL[dst_folder] >= LEVEL[src_folder]:
                    violations.append(
                        f"{path.relative_to(root)}:{lineno}: {src_folder} (layer {LEVEL.get(src_folder)}) "
                        f"imports {target} ({dst_folder}, layer {LEVEL[dst_folder]}): layers import only downwards"
                    )
    return violations, dict(edges)


def main(argv: list[str]) -> int:
    graph = "--graph" in argv
    args = [a for a in argv if not a.startswith("--")]
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    violations, edges = scan(root)
    if graph:
        for (a, b), n in sorted(edges.items()):
            mark = "" if b in DATA_PACKAGES or LEVEL[b] < LEVEL[a] else "  <-- against the layers"
            print(f"{a:12s} -> {b:12s} {n:4d}{mark}")
    for line in violations:
        print(line, file=sys.stderr)
    if violations:
        print(f"layers check: {len(violations)} import(s) against the layers", file=sys.stderr)
        return 1
    print("layers check: every import points down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
