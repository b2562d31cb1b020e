"""The jinja2 sandbox that chat templates run in, with limits on one render's memory and time.

jinja2's sandbox keeps a template away from Python's internals and caps ``range()`` at 100,000
items, but a template (it comes with the model file) can still ask for ``'x' * 1000000000`` or
loop 10^10 times. Here, per render (:func:`limits`):

- every for-loop iteration counts against a budget of :data:`MAX_ITERATIONS` (loops over
  ``range()``, messages, strings alike; nested loops multiply);
- a string, list or number built by ``*``, ``+``, ``**``, ``~`` or by a method or filter with a
  width or count argument (``center``, ``ljust``, ``batch``, ...) may not exceed the size limit:
  :data:`BASE_CHARS` plus 4 times the size of the inputs (messages, tools, documents);
- the rendered text may not exceed the same limit (``render_limited``).

Past a limit the render stops with :class:`TemplateLimitError`. Real templates stay far inside.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

MAX_ITERATIONS = 1_000_000  # for-loop iterations in one render (about a second of jinja)
BASE_CHARS = 4_000_000  # size limit with empty inputs, in characters (or list items)

_COUNTED = "_clearlm_counted"  # the filter put around every for-loop's iterable
_SIZED = "_clearlm_sized"  # the filter put around every `a ~ b`
_WIDTH_FILTERS = ("center", "indent", "batch", "slice")
_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})


class TemplateLimitError(jinja2.TemplateError):
    """The template went past a limit of one render (size or loop iterations)."""


@dataclass
class _Limits:
    max_chars: int
    iterations_left: int


_CURRENT: ContextVar[_Limits | None] = ContextVar("clearlm_template_limits", default=None)


def _limits() -> _Limits:
    got = _CURRENT.get()
    if got is None:  # at compile time (constant folding): the node stays for the render
        raise TemplateLimitError("template limits are set only during a render")
    return got


@contextmanager
def limits(input_chars: int) -> Iterator[_Limits]:
    """Limits for the renders inside the ``with`` (this thread / task only).

    Args:
        input_chars: size of the inputs (characters of the messages, tools, documents as JSON).
    """
    token = _CURRENT.set(_Limits(BASE_CHARS + 4 * input_chars, MAX_ITERATIONS))
    try:
        yield _CURRENT.get()  # type: ignore[misc]
    finally:
        _CURRENT.reset(token)


def _check_size(n: int, what: str, unit: str = "characters or items") -> None:
    cap = _limits().max_chars
    if n > cap:
        raise TemplateLimitError(f"it builds {what} of {n:,} {unit} (the limit is {cap:,})")


def _check_width(args: Iterable[Any], what: str) -> None:
    cap = _limits().max_chars
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > cap:
            raise TemplateLimitError(f"{what} with a size of {a:,} (the limit is {cap:,})")


@jinja2.pass_context  # pass_context: never folded at compile time
def _counted(_: Any, iterable: Any) -> Iterator[Any]:
    state = _limits()
    for item in iterable:
        state.iterations_left -= 1
        if state.iterations_left < 0:
            raise TemplateLimitError(f"its loops run over {MAX_ITERATIONS:,} iterations")
        yield item


@jinja2.pass_context
def _sized(_: Any, value: Any) -> Any:
    _check_size(len(value), "a string", "characters")
    return value


def _width_checked(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)  # copies jinja's pass_* mark along with the name
    def checked(*args: Any, **kwargs: Any) -> Any:
        _check_width([*args[1:], *kwargs.values()], f"the filter {name}")
        return f(*args, **kwargs)

    return checked


def _length(x: Any) -> int | None:
    if isinstance(x, str | list | tuple):
        return len(x)
    return None


class _Guard(NodeTransformer):
    """Puts the counting filter around every loop's iterable and the size check around ``~``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _COUNTED, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        node = self.generic_visit(node)
        return nodes.Filter(node, _SIZED, [], [], None, None, lineno=node.lineno)


class LimitedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox whose templates are held to :func:`limits` (compile with
    :meth:`compile_limited`; render inside ``with limits(...)``)."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters[_COUNTED] = _counted
        self.filters[_SIZED] = _sized
        for name in _WIDTH_FILTERS:
            self.filters[name] = _width_checked(name, self.filters[name])

    def compile_limited(self, source: str) -> jinja2.Template:
        """``from_string(source)`` with every loop counted and every ``~`` size-checked."""
        tree = _Guard().visit(self.parse(source))
        return self.template_class.from_code(self, self.compile(tree), self.make_globals(None))

    def call_binop(self, context: Any, op: str, left: Any, right: Any) -> Any:
        """The operator, refused (TemplateLimitError) where its result would be too large."""
        if op == "*":
            for seq, n in ((left, right), (right, left)):
                size = _length(seq)
                if size is not None and isinstance(n, int):
                    _check_size(size * n, "a repeated string or list")
            if isinstance(left, int) and isinstance(right, int):
                _check_size((left.bit_length() + right.bit_length()) // 3, "a number", "digits")
        elif op == "+":
            a, b = _length(left), _length(right)
            if a is not None and b is not None:
                _check_size(a + b, "a joined string or list")
        elif op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            _check_size(left.bit_length() * right // 3, "a number", "digits")
        return super().call_binop(context, op, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        """A call from the template; ``str.center(n)`` and the like refused for huge n."""
        if isinstance(getattr(__obj, "__self__", None), str) and (
            getattr(__obj, "__name__", "") in _WIDTH_METHODS
        ):
            _check_width([*args, *kwargs.values()], f"the method {__obj.__name__}")
        return super().call(__context, __obj, *args, **kwargs)


def render_limited(template: jinja2.Template, max_chars: int, **variables: Any) -> str:
    """The rendered text, stopped (TemplateLimitError) once it grows past ``max_chars``."""
    out: list[str] = []
    size = 0
    for chunk in template.generate(**variables):
        size += len(chunk)
        if size > max_chars:
            raise TemplateLimitError(f"it renders over {max_chars:,} characters")
        out.append(chunk)
    return "".join(out)

