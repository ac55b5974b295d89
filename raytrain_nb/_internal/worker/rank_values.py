"""Rank values: which notebook assignments hold only a rank's own context, and re-evaluating them on a rank.

A cell that trained is not replayed on a new rank, and a value that differs across ranks is not copied
from a peer, so ``rank = get_context().get_world_rank()`` made in such a cell is missing on a replacement,
and ``world_size`` is stale on the survivors of a rescale. After the group re-forms, every rank runs
again the top-level assignments whose value comes only from its context (:func:`plan_rank_values`, a
static analysis of the cells' source) and keeps what they give (:func:`reevaluate`). Names computed
from those (``is_main = rank == 0``) are only named, never run again: their cells may do anything else.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from .cell import needs_ipython

# -- what counts as a rank's own value: the one place that says so ------------------------------------

#: Functions whose value is the calling rank's own, by the path they are imported from; an ``object`` is a
#: context whose getters (:data:`CONTEXT_GETTERS`) are rank values too.
CONTEXT_FUNCTIONS: Mapping[str, str] = {
    "raytrain_nb.get_context": "object",
    "raytrain_nb.train.get_context": "object",
    "raytrain_nb.torch.get_device": "value",
    "raytrain_nb.torch.get_devices": "value",
    "raytrain_nb.train.torch.get_device": "value",
    "raytrain_nb.train.torch.get_devices": "value",
    "torch.distributed.get_rank": "value",
    "torch.distributed.get_world_size": "value",
}
#: The getters of a context (``TrainContext``) whose value is the rank's own.
CONTEXT_GETTERS = frozenset({"get_world_rank", "get_world_size", "get_local_rank", "get_local_world_size",
                             "get_node_rank", "get_experiment_name", "get_trial_name"})
#: Calls that read an environment variable (the first argument names it), and the mapping read by subscript.
ENV_READERS = frozenset({"os.getenv", "os.environ.get"})
ENVIRONS = frozenset({"os.environ"})
#: The environment variables the group sets on every rank for its place (``group/ranks.py``).
RANK_ENV_VARS = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"})
#: Built-ins that keep a rank value a rank value (``int(os.environ["RANK"])``).
CONVERSIONS = frozenset({"int", "str"})

# A name's latest binding: ("path", "module.attr") from an import, ("pure", kind, statement), ("derived",) or
# ("other",): anything else (absent: never bound, or deleted).
_Binding = Tuple[Any, ...]
_HEADERS: Dict[type, Tuple[str, ...]] = {ast.If: ("test",), ast.While: ("test",), ast.For: ("iter",),
                                         ast.AsyncFor: ("iter",), ast.With: ("items",), ast.AsyncWith: ("items",)}
if hasattr(ast, "Match"):  # Python 3.10+
    _HEADERS[ast.Match] = ("subject",)
#: Patterns of ``match`` that bind a name (``case [x, *rest]``), where Python has them.
_PATTERNS = tuple(getattr(ast, n) for n in ("MatchAs", "MatchStar") if hasattr(ast, n))


@dataclasses.dataclass(frozen=True)
class RankValuePlan:
    """What to run again on every rank after the group re-forms.

    Attributes:
        statements: the assignments to run, in history order (earlier ones some of them need included).
        names: the names they re-evaluate, kept on the rank (each one's latest assignment is a rank value).
        dependents: names computed from rank values that are not rank values themselves (not re-evaluated).
    """

    statements: Tuple[str, ...] = ()
    names: Tuple[str, ...] = ()
    dependents: Tuple[str, ...] = ()


@dataclasses.dataclass
class _Statement:
    source: str
    names: List[str]
    needs: Set[int]


class _Analysis:
    """One pass over the cells' top-level statements, in order, tracking each name's latest binding."""

    def __init__(self) -> None:
        self.env: Dict[str, _Binding] = {}
        self.statements: List[_Statement] = []
        self.order: Dict[str, int] = {}  # when each name was last bound (for the dependents' order)
        self.seq = 0

    # -- expressions ---------------------------------------------------------------------------------

    def path(self, node: ast.AST) -> Optional[str]:
        """The dotted path an expression names through the imports seen so far (``dist.get_rank``)."""
        if isinstance(node, ast.Name):
            binding = self.env.get(node.id)
            return binding[1] if binding is not None and binding[0] == "path" else None
        if isinstance(node, ast.Attribute):
            base = self.path(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        return None

    def kind(self, node: ast.AST, needs: Set[int]) -> Optional[str]:
        """``object`` / ``value`` when ``node``'s value comes only from the rank's context, else None; the
        statements whose names it reads go into ``needs``."""
        if isinstance(node, ast.Name):
            binding = self.env.get(node.id)
            if binding is not None and binding[0] == "pure":
                needs.add(binding[2])
                return binding[1]
            return None
        if isinstance(node, ast.Subscript):
            key = node.slice
            if self.path(node.value) in ENVIRONS and isinstance(key, ast.Constant) and key.value in RANK_ENV_VARS:
                return "value"
            return None
        if not isinstance(node, ast.Call) or any(kw.arg is None for kw in node.keywords):
            return None
        args = list(node.args) + [kw.value for kw in node.keywords]
        constant = all(isinstance(a, ast.Constant) for a in args)
        func = node.func
        path = self.path(func)
        if path in CONTEXT_FUNCTIONS and constant:
            return CONTEXT_FUNCTIONS[path]
        if path in ENV_READERS and constant and node.args and not node.keywords \
                and node.args[0].value in RANK_ENV_VARS:  # type: ignore[attr-defined]
            return "value"
        if isinstance(func, ast.Name) and func.id in CONVERSIONS and func.id not in self.env \
                and len(node.args) == 1 and not node.keywords:
            return "value" if self.kind(node.args[0], needs) is not None else None
        if isinstance(func, ast.Attribute) and func.attr in CONTEXT_GETTERS and not args:
            inner: Set[int] = set()
            if self.kind(func.value, inner) == "object":
                needs.update(inner)
                return "value"
        return None

    def reads_rank_values(self, nodes: Iterable[ast.AST]) -> bool:
        """Whether any of ``nodes`` reads a name bound to a rank value or to something computed from one."""
        for node in nodes:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) \
                        and self.env.get(sub.id, ("",))[0] in ("pure", "derived"):
                    return True
        return False

    # -- statements ----------------------------------------------------------------------------------

    def bind(self, name: str, binding: Optional[_Binding]) -> None:
        self.seq += 1
        self.order[name] = self.seq
        if binding is None:
            self.env.pop(name, None)
        else:
            self.env[name] = binding

    def other(self, names: Iterable[str], derived: bool) -> None:
        for name in names:
            self.bind(name, ("derived",) if derived else ("other",))

    def record(self, source: str, names: List[str], kind_of: Dict[str, str], needs: Set[int]) -> None:
        index = len(self.statements)
        self.statements.append(_Statement(source, names, needs))
        for name in names:
            self.bind(name, ("pure", kind_of[name], index))

    def statement(self, node: ast.stmt) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self.imports(node)
        elif isinstance(node, ast.Assign):
            self.assign(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            self.assign(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            derived = self.env.get(name, ("",))[0] in ("pure", "derived") or self.reads_rank_values([node.value])
            self.other([name], derived)
        elif isinstance(node, ast.Delete):
            for name in _target_names(node.targets):
                self.bind(name, None)  # gone (a built-in of that name is seen again)
        else:  # def, class, if/for/while/with/try blocks...: what they bind is not a rank value
            for inner in _walk_scope(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    self.imports(inner)  # `try: import torch.distributed as dist` still names the module
            header = [getattr(node, field) for field in _HEADERS.get(type(node), ())]
            flat = [x for h in header for x in (h if isinstance(h, list) else [h])]
            self.other(_bound_names(node), self.reads_rank_values(flat))

    def imports(self, node: Any) -> None:
        for alias in node.names:
            if isinstance(node, ast.Import):
                name = alias.asname or alias.name.split(".")[0]
                self.bind(name, ("path", alias.name if alias.asname else name))
            elif alias.name != "*":
                name = alias.asname or alias.name
                known = not node.level and node.module
                self.bind(name, ("path", f"{node.module}.{alias.name}") if known else ("other",))

    def assign(self, node: ast.Assign) -> None:
        value, targets = node.value, node.targets
        if all(isinstance(t, ast.Name) for t in targets):
            needs: Set[int] = set()
            kind = self.kind(value, needs)
            names = [t.id for t in targets]  # type: ignore[attr-defined]
            if kind is not None:
                self.record(ast.unparse(node), names, dict.fromkeys(names, kind), needs)
            else:
                self.other(names, self.reads_rank_values([value]))
            return
        single = targets[0] if len(targets) == 1 else None
        if isinstance(single, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                and len(single.elts) == len(value.elts) and all(isinstance(e, ast.Name) for e in single.elts):
            self.unpack([e.id for e in single.elts], value.elts, node)  # type: ignore[attr-defined]
            return
        self.other(_target_names(targets), self.reads_rank_values([value]))

    def unpack(self, names: List[str], values: List[ast.expr], node: ast.Assign) -> None:
        """``a, b = x, y``: the whole statement when every value is a rank value; else each rank value that
        reads none of the targets as its own ``a = x``."""
        kinds, needs_of = [], []
        for value in values:
            needs: Set[int] = set()
            kinds.append(self.kind(value, needs))
            needs_of.append(needs)
        if all(k is not None for k in kinds):
            self.record(ast.unparse(node), names, dict(zip(names, kinds)), set().union(*needs_of))
            return
        targets = set(names)
        reads = [self.reads_rank_values([v]) for v in values]  # judged before any target is rebound
        own = [k is not None and not (_loads(v) & targets) for k, v in zip(kinds, values)]
        for name, value, kind, needs, alone, derived in zip(names, values, kinds, needs_of, own, reads):
            if alone:
                self.record(f"{name} = {ast.unparse(value)}", [name], {name: kind}, needs)  # type: ignore[dict-item]
            else:
                self.other([name], derived)

    # -- the result ----------------------------------------------------------------------------------

    def plan(self) -> RankValuePlan:
        chosen = {b[2] for b in self.env.values() if b[0] == "pure"}
        names = [n for s in sorted(chosen) for n in self.statements[s].names
                 if self.env.get(n, ("",))[0] == "pure" and self.env[n][2] == s]
        needed, todo = set(), list(chosen)
        while todo:
            index = todo.pop()
            if index not in needed:
                needed.add(index)
                todo.extend(self.statements[index].needs)
        dependents = sorted((n for n, b in self.env.items() if b[0] == "derived"), key=lambda n: self.order[n])
        return RankValuePlan(tuple(self.statements[i].source for i in sorted(needed)), tuple(dict.fromkeys(names)),
                             tuple(dependents))


def _walk_scope(node: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``node`` that runs in the notebook's own scope (not inside a def, class, lambda or
    comprehension below it)."""
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return  # its name is bound here (the caller reads it); its body is another scope
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            yield from _walk_scope(child)


def _bound_names(node: ast.AST) -> List[str]:
    """The names a statement binds in the notebook's scope, in order."""
    out: List[str] = []
    for sub in _walk_scope(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            out.append(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(sub.name)
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            out.append(sub.name)
        elif isinstance(sub, _PATTERNS) and getattr(sub, "name", None):
            out.append(sub.name)  # type: ignore[attr-defined]
        elif getattr(sub, "rest", None) and type(sub).__name__ == "MatchMapping":
            out.append(sub.rest)  # type: ignore[attr-defined]
    return list(dict.fromkeys(out))


def _target_names(targets: Sequence[ast.expr]) -> List[str]:
    return list(dict.fromkeys(n for t in targets for n in _bound_names(ast.Expr(value=t))))


def _loads(node: ast.AST) -> Set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def parse_cell(source: str) -> Optional[ast.Module]:
    """A cell's syntax tree; lines of IPython syntax (``%time``, ``!ls``) read as ``pass``; None if it does
    not parse."""
    try:
        return ast.parse(source)
    except SyntaxError:
        pass
    lines = [(line[:len(line) - len(line.lstrip())] + "pass") if needs_ipython(line) else line
             for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def plan_rank_values(sources: Sequence[str]) -> RankValuePlan:
    """What a rank runs again after the group re-forms, from the source of the group's cells in history order.

    A name is re-evaluated when its latest binding is a simple top-level ``name = expr`` (or a tuple of
    names) whose value comes only from the rank's context (:data:`CONTEXT_FUNCTIONS`, the getters of a
    context, the rank's environment variables, ``int()`` of those, or a name that is such a value).
    Anything bound inside ``if``/``for``/``def``... or rebound later to anything else is left alone; a name
    computed from rank values is a dependent, named but not re-evaluated.
    """
    analysis = _Analysis()
    for source in sources:
        tree = parse_cell(source)
        for node in tree.body if tree is not None else ():
            analysis.statement(node)
    return analysis.plan()


def reevaluate(namespace: Dict[str, Any], statements: Sequence[str], names: Sequence[str]) -> Dict[str, Any]:
    """Run ``statements`` (a :class:`RankValuePlan`'s) on a copy of ``namespace``, then keep ``names`` in it.

    What the statements bind is cleared from the copy first, so a statement that fails leaves its names
    unset and a later one that reads them fails too (rather than reading the stale value). Run on the
    rank's cell thread, with its new context set.

    Returns:
        ``{"set": names set, "failed": {name: "Type: message"}}``.
    """
    scratch = dict(namespace)
    parsed = [(source, _target_names(ast.parse(source).body[0].targets)) for source in statements]  # type: ignore
    for _, bound in parsed:
        for name in bound:
            scratch.pop(name, None)
    failed: Dict[str, str] = {}
    for source, bound in parsed:
        try:
            exec(compile(source, "<rank values>", "exec"), scratch)  # noqa: S102 - the user's own assignment
        except Exception as exc:  # noqa: BLE001 - named in the recovery's summary
            missing = getattr(exc, "name", None) if isinstance(exc, NameError) else None
            text = str(exc).strip().splitlines()
            reason = failed.get(missing) or f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
            for name in bound:
                failed[name] = reason
    done: List[str] = []
    for name in names:
        if name in failed:
            continue
        if name in scratch:
            namespace[name] = scratch[name]
            done.append(name)
        else:
            failed[name] = "not set"
    return {"set": done, "failed": {n: failed[n] for n in names if n in failed}}
