"""Which process's code may import what, read from the source itself (every import statement,
those inside functions too, followed through the modules they reach)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OWN = ("watchdog", "agent")
# What a training rank must never load: the hook runs inside user code, beside fork().
NEVER_IN_TRAINING = ("grpc", "google.protobuf", "agent", "watchdog.transport",
                     "watchdog.coordinator", "watchdog.cli", "watchdog.supervise", "sqlite3",
                     "psycopg", "asyncio", "prometheus_client", "watchdog.metrics")
# What the agent may use of `watchdog`: the modules shared by design (agent/__init__.py).
AGENT_MAY_USE = ("watchdog.beacon", "watchdog.beacondir", "watchdog.env", "watchdog.errors",
                 "watchdog.frames", "watchdog.model", "watchdog.explain", "watchdog.transport",
                 "watchdog.text", "watchdog.metrics")


def module_file(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def own_modules() -> list[str]:
    names = []
    for top in OWN:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "proto" in parts or "boot" in parts:
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def module_level(tree: ast.Module) -> list[ast.AST]:
    """The statements that run on import: not those in function bodies."""
    found: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            todo.extend(ast.iter_child_nodes(node))
    return found


@cache
def direct_imports(name: str, lazy: bool = True) -> frozenset[str]:
    """Every module `name` imports, its own packages' __init__ included; with `lazy`, those
    imported inside functions too."""
    path = module_file(name)
    assert path is not None, name
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if lazy else module_level(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(with_parents(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.update(with_parents(base))
            for alias in node.names:
                if module_file(f"{base}.{alias.name}") is not None:
                    found.add(f"{base}.{alias.name}")
    return frozenset(found - {name})


def reachable(start: str, lazy: bool = True) -> set[str]:
    """Every module importing `start` may load, own ones followed transitively; without `lazy`,
    what importing it loads before any function runs."""
    seen, todo = set(), [*with_parents(start)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.split(".")[0] in OWN and module_file(name) is not None:
            todo.extend(direct_imports(name, lazy))
    return seen


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("start", ["watchdog", "watchdog.hook", "watchdog.beacon"])
def test_the_hook_loads_no_grpc_protobuf_agent_or_daemon_code(start: str) -> None:
    loaded = sorted(m for m in reachable(start) if within(m, NEVER_IN_TRAINING))
    assert loaded == []


def test_the_coordinator_never_loads_the_hooks_torch_patches() -> None:
    loaded = reachable("watchdog.coordinator", lazy=False)
    assert not any(within(m, ("watchdog.hook.patches",)) for m in loaded)
    assert not any(within(m, ("torch",)) for m in loaded)


def test_the_list_of_collectives_the_hook_and_coordinator_share_is_stdlib_only() -> None:
    assert sorted(m for m in direct_imports("watchdog.collectives") if within(m, OWN)) == []


def test_nothing_outside_the_cli_imports_it() -> None:
    importers = [name for name in own_modules() if not within(name, ("watchdog.cli",))
                 and name != "watchdog.__main__"
                 and any(within(m, ("watchdog.cli",)) for m in direct_imports(name))]
    assert importers == []


def test_only_the_cli_imports_the_supervisor() -> None:
    """What `watchdog run` does beside its job (`watchdog.supervise`) is a command's business:
    no daemon, coordinator or report reaches into it."""
    importers = [name for name in own_modules()
                 if not within(name, ("watchdog.cli", "watchdog.supervise"))
                 and any(within(m, ("watchdog.supervise",)) for m in direct_imports(name))]
    assert importers == []


def test_the_agent_uses_only_the_shared_modules_of_watchdog() -> None:
    used = {m for name in own_modules() if within(name, ("agent",))
            for m in direct_imports(name) if within(m, ("watchdog",)) and m != "watchdog"}
    assert sorted(m for m in used if not within(m, AGENT_MAY_USE)) == []


def test_generated_protobuf_code_is_seen_by_the_transport_alone() -> None:
    users = [name for name in own_modules() if not within(name, ("watchdog.transport",))
             and any(within(m, ("watchdog.transport.proto",)) for m in direct_imports(name))]
    assert users == []
