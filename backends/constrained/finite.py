"""Does any *finite* JSON value satisfy a schema?  Decided on the schema itself, before llguidance compiles it.

Why: a schema whose required property (or required array item) refers back to itself through `$ref` has no
finite instance: `{"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"]}`.  llguidance
compiles it without complaint; the reply can then only nest forever, so generation either runs into llguidance's
per-step item limit while fast-forwarding the forced `{"self":{"self":...` (a failure in the middle of sampling)
or, when a model-chosen token separates the levels, runs until max_tokens and returns JSON that can never
validate.  Both are the request's fault and knowable up front, so they are a 400 before any model runs.

How: the least fixpoint of "this schema admits a finite value", over the `$ref` targets (the classic
productive-symbol analysis of a grammar).  Every rule over-approximates (keywords it does not model count as
satisfiable), so a schema is refused only when no finite value can exist; anything subtler is left to llguidance,
whose own limits still bound it.  Pure Python, linear in the schema per pass, with a work budget: a schema too
large to decide within it is passed on, not refused.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any
from urllib.parse import unquote

from backends.errors import ConstraintError

_BUDGET = 200_000  # schema nodes visited in all (~0.2 s at worst); past it the schema is not refused here
_HINT = (
    "make the recursive property optional (leave it out of `required`), or give the recursion a branch that "
    'ends, e.g. {"anyOf": [{"$ref": ...}, {"type": "null"}]} or minItems 0'
)


_ENDLESS = "a value would have to nest without end"


class _OutOfBudget(Exception):
    pass


def check_finite(schema: Any) -> None:
    """Raise ConstraintError (one line, naming the schema locations) when no finite JSON value satisfies
    `schema` (a parsed JSON Schema); return quietly when one may."""
    try:
        why = _Analysis(schema).why_not()
    except (_OutOfBudget, RecursionError):
        return
    if why is not None:
        endless = why.endswith(_ENDLESS)
        raise ConstraintError(
            f"no {'finite ' if endless else ''}JSON value satisfies the schema: {why}",
            _HINT if endless else "send a schema some value satisfies",
        )


class _Analysis:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.fuel = _BUDGET
        self.targets: dict[str, Any] = {}  # "#/..." -> the schema a local $ref points at
        self.users: dict[str, set[str]] = {}  # target -> the targets whose subtree refers to it
        self.finite: set[str] = set()  # targets known to admit a finite value (grows to the least fixpoint)
        self.targets["#"] = root  # the root is a target whether or not a $ref names it
        self._collect(root, "#", "#")

    # -- the fixpoint --------------------------------------------------------------------------------------
    def why_not(self) -> str | None:
        """None when the root may admit a finite value, else the chain of locations that shows why not."""
        work = deque(self.targets)
        queued = set(work)
        while work:
            target = work.popleft()
            queued.discard(target)
            if target not in self.finite and self._admits(self.targets[target], target) is None:
                self.finite.add(target)
                for user in self.users.get(target, ()):
                    if user not in self.finite and user not in queued:
                        work.append(user)
                        queued.add(user)
        if self._admits(self.root, "#") is None:
            return None
        return self._explain()

    def _collect(self, node: Any, path: str, owner: str) -> None:
        """Record every local $ref target and which target's subtree uses it (the fixpoint's dependencies)."""
        stack = [(node, path, owner)]
        while stack:
            node, path, owner = stack.pop()
            self._burn()
            if isinstance(node, list):
                stack.extend((v, f"{path}/{i}", owner) for i, v in enumerate(node))
                continue
            if not isinstance(node, dict):
                continue
            ref = node.get("$ref")
            if isinstance(ref, str):
                target = _resolve(self.root, ref)
                if target is not _MISSING:
                    key = _key(ref)
                    if key not in self.targets:
                        self.targets[key] = target
                        stack.append((target, key, key))
                    self.users.setdefault(key, set()).add(owner)
            for k, v in node.items():
                if k not in ("enum", "const", "default", "examples") and isinstance(v, (dict, list)):
                    stack.append((v, f"{path}/{_escape(k)}", owner))

    def _burn(self) -> None:
        self.fuel -= 1
        if self.fuel < 0:
            raise _OutOfBudget

    # -- one schema under the current assumptions -----------------------------------------------------------
    def _admits(self, node: Any, path: str) -> tuple[str, str | None] | None:
        """None when `node` may admit a finite value; else (why, the $ref key it depends on or None)."""
        self._burn()
        if node is False:
            return (f"{path} is `false`", None)
        if not isinstance(node, dict) or "const" in node or "enum" in node:
            return None  # true, not a schema (llguidance says so), or a literal: finite
        ref = node.get("$ref")
        if isinstance(ref, str) and _resolve(self.root, ref) is not _MISSING and _key(ref) not in self.finite:
            return (f'{path} is $ref "{ref}"', _key(ref))
        for i, sub in enumerate(_list(node.get("allOf"))):
            blocked = self._admits(sub, f"{path}/allOf/{i}")
            if blocked is not None:
                return blocked
        for word in ("anyOf", "oneOf"):
            branches = _list(node.get(word))
            if branches and all(self._admits(b, f"{path}/{word}/{i}") is not None for i, b in enumerate(branches)):
                first = self._admits(branches[0], f"{path}/{word}/0")
                assert first is not None
                return (f"no branch of {path}/{word} admits a finite value ({first[0]})", first[1])
        types = node.get("type")
        types = [types] if isinstance(types, str) else types if isinstance(types, list) else None
        if types is None or any(t not in ("object", "array") for t in types):
            return None  # a string, number, boolean or null value is always possible
        blocked_by: tuple[str, str | None] | None = None
        for t in types:
            blocked = self._object(node, path) if t == "object" else self._array(node, path)
            if blocked is None:
                return None
            blocked_by = blocked_by or blocked
        return blocked_by

    def _object(self, node: dict, path: str) -> tuple[str, str | None] | None:
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        patterns = node.get("patternProperties") if isinstance(node.get("patternProperties"), dict) else {}
        for name in _list(node.get("required")):
            if not isinstance(name, str):
                continue
            # every schema that applies to the value of `name`: its property, each pattern it matches, or else
            # additionalProperties (JSON Schema applies them all, so each must admit a finite value)
            applies = [(properties[name], f"{path}/properties/{_escape(name)}")] if name in properties else []
            for pattern, sub in patterns.items():
                matched = _matches(pattern, name)
                if matched is None:
                    applies = []  # a pattern Python's re cannot read: assume the value can be finite
                    break
                if matched:
                    applies.append((sub, f"{path}/patternProperties/{_escape(pattern)}"))
            else:
                if not applies and "additionalProperties" in node:
                    applies = [(node["additionalProperties"], f"{path}/additionalProperties")]
            for sub, where in applies:
                blocked = self._admits(sub, where)
                if blocked is not None:
                    return (f'{path} requires property "{name}"; {blocked[0]}', blocked[1])
        return None

    def _array(self, node: dict, path: str) -> tuple[str, str | None] | None:
        min_items = node.get("minItems", 0)
        min_items = min_items if isinstance(min_items, int) and not isinstance(min_items, bool) else 0
        prefix = node.get("prefixItems")
        items = node.get("items")
        if not isinstance(prefix, list) and isinstance(items, list):  # the tuple form of drafts 4-7
            prefix, rest, rest_word = items, node.get("additionalItems", True), "additionalItems"
        else:
            rest, rest_word = (items if items is not None else True), "items"
        prefix = prefix if isinstance(prefix, list) else []
        for i in range(min(min_items, len(prefix))):
            blocked = self._admits(prefix[i], f"{path}/prefixItems/{i}")
            if blocked is not None:
                return (f"{path} requires item {i}; {blocked[0]}", blocked[1])
        if min_items > len(prefix):
            blocked = self._admits(rest, f"{path}/{rest_word}")
            if blocked is not None:
                items = "item" if min_items == 1 else "items"
                return (f"{path} requires at least {min_items} {items}; {blocked[0]}", blocked[1])
        if "contains" in node and node.get("minContains", 1) != 0:
            blocked = self._admits(node["contains"], f"{path}/contains")
            if blocked is not None:
                return (f"{path} requires an item matching contains; {blocked[0]}", blocked[1])
        return None

    # -- the message -----------------------------------------------------------------------------------------
    def _explain(self) -> str:
        """Follow the first blocking step from the root through $refs until a target repeats (a cycle: every
        value would contain another without end) or a schema admits nothing at all."""
        steps, seen = [], set()
        node, path = self.root, "#"
        while True:
            blocked = self._admits(node, path)
            assert blocked is not None
            why, target = blocked
            steps.append(why)
            if target is None:
                return _chain(steps)
            if target in seen or target == "#":
                if not any(" requires " in step for step in steps):  # nothing but references: no value at all
                    return _chain(steps) + f", which leads back to {target}: a $ref cycle that never reaches a schema"
                return _chain(steps) + f", which leads back to {target}: {_ENDLESS}"
            seen.add(target)
            node, path = self.targets[target], target


_MISSING = object()


def _chain(steps: list[str], keep: int = 6) -> str:
    """The steps joined, the middle of a long chain elided so that the message stays one readable line."""
    if len(steps) > keep:
        steps = [*steps[:3], f"... {len(steps) - 5} more steps ...", *steps[-2:]]
    return "; ".join(steps)


def _matches(pattern: str, name: str) -> bool | None:
    """Whether a patternProperties regex (ECMA 262, unanchored) matches `name`; None when Python's re cannot
    read it.  The simple patterns schemas use read the same in both."""
    try:
        return re.search(pattern, name) is not None
    except (re.error, RecursionError, OverflowError):
        return None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _key(ref: str) -> str:
    return "#" + ref[1:].rstrip("/") if ref.startswith("#") else ref


def _resolve(root: Any, ref: str) -> Any:
    """The schema a same-document `$ref` ("#", "#/$defs/x", "#/properties/a/items") points at, or _MISSING
    (another document, an anchor, a bad pointer: llguidance resolves or refuses those itself)."""
    if not ref.startswith("#") or (len(ref) > 1 and not ref.startswith("#/")):
        return _MISSING

    node = root
    for part in ref[2:].split("/") if len(ref) > 2 else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node
