"""Static architecture checks over a source tree, read with `ast` (nothing is imported or executed).

Four checks, each a pure function of a directory tree that returns its offenders (empty when the rule
holds), so the tests can run them on the real repository and on small synthetic trees alike:

- `import_cycles`: strongly connected components of the module import graph (every ``import`` and
  ``from ... import``, absolute or relative, at module level, inside functions and under
  ``if TYPE_CHECKING:``; ``from pkg import name`` counts as an import of ``pkg.name`` when that is a
  module of the tree, else of ``pkg``).
- `forbidden_imports`: imports of given top-level packages (boto3, botocore, mypy_boto3_*) from files
  that no allowlist pattern covers; ``importlib.import_module("...")`` / ``__import__("...")`` with a
  literal name count too.
- `forbidden_attribute_uses`: uses of given attribute names (DynamoDB write methods such as
  ``update_item``) in files that no allowlist pattern covers; ``getattr(x, "update_item")`` counts too.
- `unmirrored_test_dirs`: test folders whose name is not a source package.

Paths in results and allowlist patterns are POSIX paths relative to the tree's root; patterns are
`fnmatch` patterns, in which ``*`` also matches ``/``.
"""

from __future__ import annotations

import ast
import fnmatch
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Offence:
    """One rule violation: where, and what."""

    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


@dataclass
class Module:
    name: str
    path: str  # relative to the root
    is_package: bool
    tree: ast.Module = field(repr=False)


@dataclass(frozen=True)
class ImportRef:
    """One imported name as written, fully qualified (relative imports resolved)."""

    name: str
    line: int


# ------------------------------------------------------------------------------------------ discovery


def discover(root: Path, packages: Sequence[str]) -> dict[str, Module]:
    """Every ``.py`` file under ``root/<package>`` for each package, keyed by dotted module name."""
    modules: dict[str, Module] = {}
    for package in packages:
        base = root / package
        if not base.is_dir():
            raise FileNotFoundError(f"no package directory {base}")
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join(parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))
            modules[name] = Module(name=name, path=rel.as_posix(), is_package=is_package, tree=tree)
    return modules


def matches(path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


# ------------------------------------------------------------------------------------------ imports


def _absolute_base(module: Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    parts = package.split(".") if package else []
    if node.level - 1 > len(parts):
        raise ValueError(f"{module.path}:{node.lineno}: relative import beyond the top-level package")
    parts = parts[: len(parts) - (node.level - 1)]
    if node.module:
        parts.append(node.module)
    return ".".join(parts)


def imports_of(module: Module) -> Iterator[ImportRef]:
    """Every imported name of a module, anywhere in its body, as absolute dotted names.

    ``from a.b import c`` yields both ``a.b`` and ``a.b.c`` (the caller decides which one is a module).
    """
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield ImportRef(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute_base(module, node)
            if base:
                yield ImportRef(base, node.lineno)
            for alias in node.names:
                if alias.name != "*":
                    yield ImportRef(f"{base}.{alias.name}" if base else alias.name, node.lineno)
        elif isinstance(node, ast.Call) and _is_dynamic_import(node):
            yield ImportRef(node.args[0].value, node.lineno)  # type: ignore[attr-defined]


def _is_dynamic_import(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return (
        name in ("import_module", "__import__")
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _resolve(name: str, modules: Mapping[str, Module]) -> str | None:
    """The deepest module of the tree that ``name`` names or lies in, or None if outside the tree."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: Mapping[str, Module]) -> dict[str, set[str]]:
    """Module -> modules of the tree it imports (static imports only; dynamic ones are not edges)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, module in modules.items():
        for node in ast.walk(module.tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute_base(module, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}" if base else alias.name
                    targets.append(sub if sub in modules else base)
            for target in targets:
                resolved = _resolve(target, modules)
                if resolved and resolved != name:
                    graph[name].add(resolved)
    return graph


def strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one node, each sorted, sorted by first node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def shortest_cycle(graph: Mapping[str, Iterable[str]], component: Sequence[str]) -> list[str]:
    """A shortest cycle through the component's first module, as a closed path (first == last)."""
    start = component[0]
    members = set(component)
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child not in members:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is on no cycle within {component}")  # pragma: no cover


def import_cycles(root: Path, packages: Sequence[str]) -> list[str]:
    """One line per import cycle (strongly connected component): its modules and one concrete loop."""
    graph = import_graph(discover(root, packages))
    lines = []
    for component in strongly_connected(graph):
        loop = " -> ".join(shortest_cycle(graph, component))
        lines.append(f"{len(component)} modules {component}; e.g. {loop}")
    return lines


# ------------------------------------------------------------------------------------------ rules


def _top_level_matches(name: str, forbidden: Iterable[str]) -> bool:
    top = name.partition(".")[0]
    return any(fnmatch.fnmatchcase(top, pattern) for pattern in forbidden)


def forbidden_imports(
    root: Path, packages: Sequence[str], forbidden: Iterable[str], allowed_paths: Iterable[str]
) -> list[Offence]:
    """Imports of a package whose top-level name matches a ``forbidden`` pattern, outside ``allowed_paths``."""
    forbidden, allowed_paths = list(forbidden), list(allowed_paths)
    modules = discover(root, packages)
    offences: set[Offence] = set()
    for module in modules.values():
        if matches(module.path, allowed_paths):
            continue
        for ref in imports_of(module):
            if _resolve(ref.name, modules) is None and _top_level_matches(ref.name, forbidden):
                offences.add(Offence(module.path, ref.line, f"imports {ref.name.partition('.')[0]}"))
    return sorted(offences, key=lambda o: (o.path, o.line, o.what))


def forbidden_attribute_uses(
    root: Path, packages: Sequence[str], attributes: Iterable[str], allowed_paths: Iterable[str]
) -> list[Offence]:
    """Uses of an attribute named in ``attributes`` (``x.put_item``, ``getattr(x, "put_item")``)."""
    attributes, allowed_paths = set(attributes), list(allowed_paths)
    offences: list[Offence] = []
    for module in discover(root, packages).values():
        if matches(module.path, allowed_paths):
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Attribute) and node.attr in attributes:
                offences.append(Offence(module.path, node.lineno, f".{node.attr}"))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in attributes
            ):
                offences.append(Offence(module.path, node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return sorted(set(offences), key=lambda o: (o.path, o.line, o.what))


def unmirrored_test_dirs(
    root: Path, layers: Sequence[str], source_dirs: Mapping[str, str], exceptions: Mapping[str, str]
) -> list[str]:
    """Folders directly under each ``root/<layer>`` that name no source package.

    ``source_dirs`` maps a test folder name to a source directory for the names that differ (e.g.
    ``{"agent": "onprem_agent"}``); any other name must be a directory ``gpufleet/<name>``. ``exceptions``
    maps ``"<layer>/<name>"`` to the reason it is allowed.
    """
    bad = []
    for layer in layers:
        for folder in sorted(p for p in (root / layer).iterdir() if p.is_dir()):
            if folder.name == "__pycache__" or folder.name.startswith("."):
                continue
            key = f"{layer}/{folder.name}"
            source = source_dirs.get(folder.name, f"gpufleet/{folder.name}")
            if key not in exceptions and not (root / source).is_dir():
                bad.append(f"{key} (no source package {source}/)")
    return bad


def report(title: str, offenders: Sequence[object]) -> str:
    """A failure message: the title, the count, then one offender a line."""
    return f"{title} ({len(offenders)}):\n" + "\n".join(f"  {o}" for o in offenders)
