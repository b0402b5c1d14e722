"""The named queries a module of the store sends, and the parameters each call passes, read
from its source: every call site, whether or not a test runs it.

A site is a `Query(name, params, each=...)`, or a call of a helper that makes one:
`fetch(name, **params)`, `_read_one(name, **params)`, `_worth_writing(name, **params)`,
`_apply_each(name, params, each)`. The parameters are the keys of the dictionaries passed,
followed through the names and helpers they are built by in the same module: a dictionary
literal (its `**` spreads too), a local name (each value it is given, each dictionary
`append`ed to it), a list or comprehension of dictionaries, a call of a function of the
module (the dictionaries it returns). What cannot be followed so is reported, never guessed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HELPERS = {
    "fetch": "keywords",
    "_read_one": "keywords",
    "_worth_writing": "keywords",
    "_apply_each": "positional",
}
"""Calls that make a Query of their first argument, and how they take its parameters."""


@dataclass(frozen=True)
class Site:
    name: str
    params: frozenset[str]
    batch: bool
    """Whether the query applies to a batch (`each`): its rows' keys are parameters too."""
    where: str


@dataclass
class Found:
    sites: list[Site] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    """Sites whose name or parameters could not be followed, with where they are."""


class Unreadable(Exception):
    pass


Function = ast.FunctionDef | ast.AsyncFunctionDef


class _Module:
    def __init__(self, path: Path, others: list[_Module]) -> None:
        self.path = path
        self.others = others
        """The other modules read: a helper called from this one may be theirs."""
        self.tree = ast.parse(path.read_text())
        self.functions: dict[str, Function] = {}
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
            if isinstance(node, Function):
                self.functions.setdefault(node.name, node)

    def owner(self, name: str) -> _Module | None:
        """The module whose function of that name a call here means: this one's, or
        another's read."""
        for module in [self, *self.others]:
            if name in module.functions:
                return module
        return None

    def where(self, node: ast.AST) -> str:
        return f"{self.path.name}:{getattr(node, 'lineno', '?')}"

    def scope(self, node: ast.AST) -> ast.AST:
        """The function a node is written in (its module outside any)."""
        at: ast.AST | None = node
        while at is not None and not isinstance(at, Function):
            at = self.parents.get(at)
        return at or self.tree

    # -- names ---------------------------------------------------------------------------
    def names(self, node: ast.expr) -> list[str]:
        """The query names an expression may be."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Name):
            # A loop over the keys of a dictionary literal: `for name, x in groups.items()`.
            scope = self.scope(node)
            for loop in ast.walk(scope):
                if not isinstance(loop, ast.For):
                    continue
                target = loop.target
                first = target.elts[0] if isinstance(target, ast.Tuple) else target
                if not (isinstance(first, ast.Name) and first.id == node.id):
                    continue
                source = loop.iter
                if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute):
                    source = source.func.value
                for value in self._values(scope, source):
                    if isinstance(value, ast.Dict):
                        return [n for k in value.keys if k is not None for n in self.names(k)]
        raise Unreadable(f"the query name {ast.unparse(node)!r}")

    # -- parameters ----------------------------------------------------------------------
    def keys(self, node: ast.expr) -> set[str]:
        """The keys of the dictionary (or of each dictionary of the list) `node` is."""
        if isinstance(node, ast.Dict):
            out: set[str] = set()
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None:
                    out |= self.keys(v)
                elif isinstance(k, ast.Constant) and isinstance(k.value, str):
                    out.add(k.value)
                else:
                    raise Unreadable(f"the key {ast.unparse(k)!r}")
            return out
        if isinstance(node, ast.List | ast.Tuple):
            return set().union(*(self.keys(e) for e in node.elts))
        if isinstance(node, ast.ListComp):
            return self.keys(node.elt)
        if isinstance(node, ast.Name):
            values = [(self, v) for v in self._values(self.scope(node), node)]
            values += self._arguments(node)
            if not values:
                raise Unreadable(f"the parameters in {node.id!r}")
            return set().union(*(module.keys(v) for module, v in values))
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = self.owner(name)
            if owner is not None:
                returns = [
                    r.value
                    for r in ast.walk(owner.functions[name])
                    if isinstance(r, ast.Return) and r.value is not None
                ]
                if returns:
                    return set().union(*(owner.keys(r) for r in returns))
        raise Unreadable(f"the parameters {ast.unparse(node)!r}")

    def _values(self, scope: ast.AST, name: ast.expr) -> Iterator[ast.expr]:
        """What a local name is given in its function: each value assigned to it, and each
        value `append`ed to it (an empty list assigned counts for none)."""
        if not isinstance(name, ast.Name):
            return
        for node in ast.walk(scope):
            assigned: list[tuple[ast.expr, ast.expr]] = []
            if isinstance(node, ast.Assign):
                assigned = [(target, node.value) for target in node.targets]
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                assigned = [(node.target, node.value)]
            for target, value in assigned:
                empty = isinstance(value, ast.List) and not value.elts
                if isinstance(target, ast.Name) and target.id == name.id and not empty:
                    yield value
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "append"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == name.id
            ):
                yield node.args[0]

    def _arguments(self, name: ast.Name) -> list[tuple[_Module, ast.expr]]:
        """When `name` is a parameter of its function, what each call of that function (in
        the modules read) passes for it."""
        scope = self.scope(name)
        if not isinstance(scope, Function):
            return []
        positional = [a.arg for a in [*scope.args.posonlyargs, *scope.args.args]]
        found: list[tuple[_Module, ast.expr]] = []
        for module in [self, *self.others]:
            for call in ast.walk(module.tree):
                if not isinstance(call, ast.Call):
                    continue
                func = call.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called != scope.name:
                    continue
                for kw in call.keywords:
                    if kw.arg == name.id:
                        found.append((module, kw.value))
                if name.id in positional and positional.index(name.id) < len(call.args):
                    found.append((module, call.args[positional.index(name.id)]))
        return found

    # -- sites ---------------------------------------------------------------------------
    def sites(self, found: Found) -> None:
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called != "Query" and called not in HELPERS:
                continue
            if not node.args or self._wrapper(node):
                continue
            try:
                names = self.names(node.args[0])
                params, each = self._parameters(node, called)
            except Unreadable as exc:
                found.unread.append(f"{self.where(node)}: {exc}")
                continue
            for name in names:
                batch = each is not None
                keys = frozenset(params | (each or set()))
                found.sites.append(Site(name, keys, batch, self.where(node)))

    def _wrapper(self, call: ast.Call) -> bool:
        """Whether the call passes on a name its function was given: the helper itself
        (`_read_one`, `_apply_each`), whose own callers are the sites."""
        first = call.args[0]
        scope = self.scope(call)
        if not isinstance(first, ast.Name) or not isinstance(scope, Function):
            return False
        return first.id in {a.arg for a in [*scope.args.posonlyargs, *scope.args.args]}

    def _parameters(self, call: ast.Call, called: str) -> tuple[set[str], set[str] | None]:
        params: set[str] = set()
        each: set[str] | None = None
        if called == "Query":
            if len(call.args) > 1:
                params |= self.keys(call.args[1])
            for kw in call.keywords:
                if kw.arg == "params":
                    params |= self.keys(kw.value)
                elif kw.arg == "each":
                    each = self.keys(kw.value)
        elif HELPERS[called] == "keywords":
            for kw in call.keywords:
                if kw.arg is None:
                    params |= self.keys(kw.value)
                else:
                    params.add(kw.arg)
        else:  # _apply_each(name, params, each)
            params |= self.keys(call.args[1])
            each = self.keys(call.args[2])
        return params, each


def query_sites(*paths: Path) -> Found:
    """The query sites of these modules, and those that could not be read."""
    found = Found()
    modules: list[_Module] = []
    for path in paths:
        modules.append(_Module(path, modules))
    for module in modules:
        module.sites(found)
    return found


def driver_names(path: Path) -> set[str]:
    """The queries a driver runs by name: `SQL["name"]`, `_read_one("name", ...)`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "SQL"
            and isinstance(node.slice, ast.Constant)
        ):
            names.add(str(node.slice.value))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in HELPERS
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return names
