"""Request values that many calls share as the very same object, and what the gateway derives
from them, computed once per object.

A harness sends its tool definitions unchanged on every call (Claude Code: 64 KB of its 82 KB
requests). `fastjson.KnownValues` already parses them once per process and hands every body the
same parsed object. Without this module each call would derive the same things again from that
object: the Anthropic adapter's OpenAI form of the tools, the JSON text of that form in the
upstream body, and its msgpack bytes for the record — a noticeable share of the gateway's CPU on
a Claude Code call.

Here a *shared* object (one KnownValues hands out, or one derived here from a shared one) gets
each derivation once: `derive(obj, name, make)`. The result is shared in turn, so derivations
chain (parsed tools -> chat tools -> their JSON). An object that is not shared is derived on
every call: only values that recur are remembered (tests/gateway/test_shared_values.py).


Why by identity and not by value: comparing 64 KB of nested values costs about what deriving
them does. Identity is exact here because nothing on the gateway's path changes a request value in
place (the same rule KnownValues relies on), and an entry holds its object, so its id cannot be
reused by another while the entry lives.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from polar_mq._io.locks import short_lock

T = TypeVar("T")

MAX_SHARED = 32  # objects remembered as shared (a few harnesses' tool sets, and their derivations)
MAX_DERIVED = 64


class SharedValues:
    def __init__(self, max_shared: int = MAX_SHARED, max_derived: int = MAX_DERIVED) -> None:
        self.max_shared, self.max_derived = max_shared, max_derived
        self._shared: list[Any] = []  # most recent first
        self._derived: list[tuple[Any, str, Any]] = []  # (object, derivation, result)
        self._lock = short_lock()

    def share(self, obj: Any) -> None:
        """Mark `obj` as handed to many calls unchanged."""
        with self._lock:
            if not any(o is obj for o in self._shared):
                self._shared.insert(0, obj)
                del self._shared[self.max_shared:]

    def is_shared(self, obj: Any) -> bool:
        with self._lock:
            return any(o is obj for o in self._shared)

    def derive(self, obj: Any, name: str, make: Callable[[Any], T]) -> T:
        """`make(obj)`, once per shared `obj` and derivation `name`; the result is shared too
        (a list or dict, or those in a tuple result: strings and bytes need no marking). For an
        object that is not shared, `make(obj)` every time."""
        with self._lock:
            for o, n, result in self._derived:
                if o is obj and n == name:
                    return result  # type: ignore[no-any-return]
            shared = any(o is obj for o in self._shared)
        result = make(obj)  # outside the lock: an exception leaves nothing behind
        if shared:
            with self._lock:
                self._derived.insert(0, (obj, name, result))
                del self._derived[self.max_derived:]
            for item in result if isinstance(result, tuple) else (result,):
                if isinstance(item, (list, dict)):
                    self.share(item)
        return result


SHARED = SharedValues()
