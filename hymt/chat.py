"""Chat templates (REFERENCE.md §7): render a GGUF's `tokenizer.chat_template` safely.

A GGUF's template is untrusted input. It is rendered with jinja2's `ImmutableSandboxedEnvironment` and
default options (no trim_blocks/lstrip_blocks, the source's single trailing newline dropped, no
autoescape), which keeps the official renderings byte-exact, and with two extra layers:

* **No Python internals.** Any access to an unsafe attribute (`__class__`, `mro`, `func_globals`, ...)
  raises at once instead of rendering as empty; methods that mutate lists, dicts or sets are refused.
* **Bounded work.** Every render gets a budget (`RenderLimits`): a step count, a count of characters
  produced, and a wall-clock deadline. Steps are charged by every loop iteration (a statement is
  inserted at the top of every loop body and macro body at compile time, so nested or recursive loops
  cannot escape it), every call, attribute or item access, operator, filter and output. Characters are
  charged by everything that builds text or collections (outputs, `~`, `+`, `*`, `%`, filters, method
  calls, slices) *before* anything large is allocated. Amplifying operations (`center`, `indent`,
  `replace`, `join`, `format`, `batch`, string widths, `str * n`, big integer powers) are checked against
  the remaining budget up front. Exceeding any limit raises `TemplateError`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from hymt.errors import TemplateError

if TYPE_CHECKING:
    from hymt.tokenizer import Tokenizer

__all__ = ["ChatTemplate", "RenderLimits", "flatten_content", "render", "render_chat"]

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class RenderLimits:
    """Resource limits of one render. Input characters = characters of all message contents.

    The official templates use under 20 steps per message and produce about 3 characters per output
    character; the defaults leave ample room for long conversations while bounding a hostile template to
    well under a second of CPU and tens of MB of memory.
    """

    max_steps: int = 200_000  # plus the two allowances below
    steps_per_message: int = 64
    steps_per_input_char: int = 8
    max_chars: int = 1 << 20  # characters produced, plus `chars_per_input_char` per input character
    chars_per_input_char: int = 8
    max_seconds: float = 2.0  # wall clock
    max_template_chars: int = 1 << 20  # template source size
    max_int_bits: int = 1 << 16  # integers produced by `*` and `**`
    max_format_width: int = 4096  # widths/precisions in `%` and str.format specs


DEFAULT_LIMITS = RenderLimits()


class _Raised(Exception):
    """raise_exception(message) from a template: surfaces with exactly its message."""


class _LimitExceeded(Exception):
    """A render exceeded its budget or attempted an unbounded operation."""


@dataclass
class _Budget:
    steps_left: int
    chars_left: int
    deadline: float
    limits: RenderLimits

    def tick(self, steps: int = 1) -> None:
        self.steps_left -= steps
        if self.steps_left < 0:
            raise _LimitExceeded("chat template exceeded its step limit")
        if time.monotonic() > self.deadline:
            raise _LimitExceeded("chat template exceeded its time limit")

    def charge(self, chars: int) -> None:
        self.chars_left -= chars
        if self.chars_left < 0:
            raise _LimitExceeded("chat template exceeded its output size limit")

    def charge_value(self, value: Any) -> None:
        """Charge a newly built string (its characters) or collection (its entries); others are free."""
        if isinstance(value, (str, bytes, list, tuple, dict, set, frozenset)):
            self.charge(len(value))


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("hymt_template_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:  # compile-time constant folding: refuse, so jinja2 evaluates at render time instead
        raise _LimitExceeded("not evaluated at compile time")
    return budget


def _text_size(value: Any, limit: int) -> int:
    """An upper bound of len(str(value)); stops counting once it exceeds `limit`."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, float):
        return 32
    if isinstance(value, (bytes, bytearray)):
        return 4 * len(value) + 3
    if isinstance(value, jinja2.Undefined):
        return 0
    if isinstance(value, Namespace):
        value = object.__getattribute__(value, "_Namespace__attrs")
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        items: Iterable[Any] = value.items() if isinstance(value, dict) else value
        total = 2
        for item in items:
            # Inside a container a string prints as its repr: at most 10 characters per code point.
            if isinstance(item, str):
                total += 10 * len(item) + 4
            else:
                total += _text_size(item, limit - total) + 2
            if total > limit:
                break
        return total
    return 256  # macros, loop and cycler objects, ...: short fixed reprs


# ---- operations checked before they run --------------------------------------------------------------


def _check_width(budget: _Budget, width: Any, base: int = 0) -> None:
    if isinstance(width, int) and width + base > budget.chars_left:
        raise _LimitExceeded("chat template exceeded its output size limit")


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _check_percent_format(budget: _Budget, fmt: str, args: Any) -> None:
    limits = budget.limits
    for match in _PERCENT_SPEC.finditer(fmt):
        for number in match.groups():
            if number == "*" or (number is not None and int(number) > limits.max_format_width):
                raise _LimitExceeded("chat template format width is too large")
    budget.charge(len(fmt) + _text_size(args, budget.chars_left))


def _check_str_format(budget: _Budget, fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error itself
    for _literal, _field, spec, _conversion in fields:
        if spec and (
            "{" in spec or any(int(d) > budget.limits.max_format_width for d in _DIGITS.findall(spec))
        ):
            raise _LimitExceeded("chat template format width is too large")
    budget.charge(len(fmt) + _text_size(args, budget.chars_left) + _text_size(kwargs, budget.chars_left))


def _check_binop(budget: _Budget, op: str, left: Any, right: Any) -> None:
    sequences = (str, bytes, list, tuple)
    if op == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, sequences) and isinstance(count, int) and not isinstance(count, bool):
                budget.charge(len(seq) * max(count, 0))
        if isinstance(left, int) and isinstance(right, int):
            if abs(left).bit_length() + abs(right).bit_length() > budget.limits.max_int_bits:
                raise _LimitExceeded("chat template integer is too large")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right * abs(left).bit_length() > budget.limits.max_int_bits:
                raise _LimitExceeded("chat template integer is too large")
    elif op == "+":
        if isinstance(left, sequences) and isinstance(right, sequences):
            budget.charge(len(left) + len(right))
    elif op == "%" and isinstance(left, str):
        _check_percent_format(budget, left, right)


def _joined_size(budget: _Budget, items: Iterable[Any], separator: int) -> int:
    """Characters of `separator.join(map(str, items))`, counted until it exceeds the budget."""
    total = 0
    for item in items:
        total += _text_size(item, budget.chars_left - total) + separator
        if total > budget.chars_left:
            break
    return total


def _check_method(
    budget: _Budget, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """Pre-check calls of built-in methods that can build values far larger than their inputs.

    Returns the arguments to call with (a lazy iterator passed to `join` is materialized and charged).
    """
    owner = getattr(func, "__self__", None)
    name = getattr(func, "__name__", "")
    if isinstance(owner, (str, bytes)):
        size = len(owner)
        if name in ("center", "ljust", "rjust", "zfill") and args:
            _check_width(budget, args[0])
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(tab, int):
                budget.charge(size * max(tab, 1))
        elif name == "join" and args:
            items = _materialize(budget, args[0])
            budget.charge(_joined_size(budget, items, size))
            args = (items, *args[1:])
        elif name == "replace" and len(args) >= 2:
            old, new = args[0], args[1]
            if isinstance(old, (str, bytes)) and isinstance(new, (str, bytes)):
                budget.charge(size + (size + 1) * len(new) // max(len(old), 1))
        elif name in ("translate", "maketrans"):
            raise _LimitExceeded(f"chat templates may not call {type(owner).__name__}.{name}")
    elif isinstance(owner, int) and name == "to_bytes":
        length = args[0] if args else kwargs.get("length", 1)
        _check_width(budget, length)
    return args


def _materialize(budget: _Budget, value: Any) -> Any:
    """A lazy iterator (map/select/batch/items results) becomes a list, each item charged as it appears."""
    if not isinstance(value, Iterator):
        return value
    items = []
    for item in value:
        budget.tick()
        budget.charge(_text_size(item, budget.chars_left) + 1)
        items.append(item)
    return items


# Checks of the filters that can build values far larger than their inputs, on the bound arguments.
def _pre_join(budget: _Budget, a: dict[str, Any]) -> None:
    d = a["d"]
    if isinstance(a["value"], Iterable):
        budget.charge(_joined_size(budget, a["value"], len(d) if isinstance(d, str) else 0))


def _pre_indent(budget: _Budget, a: dict[str, Any]) -> None:
    s, width = a["s"], a["width"]
    if isinstance(s, str):
        width_chars = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        budget.charge(len(s) + (s.count("\n") + 1) * max(width_chars, 0))


def _pre_replace(budget: _Budget, a: dict[str, Any]) -> None:
    s, old, new = a["s"], a["old"], a["new"]
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str):
        budget.charge(len(s) + (len(s) + 1) * len(new) // max(len(old), 1))


def _pre_format(budget: _Budget, a: dict[str, Any]) -> None:
    if isinstance(a["value"], str):
        _check_percent_format(budget, a["value"], a["kwargs"] or a["args"])


def _pre_sum(budget: _Budget, a: dict[str, Any]) -> None:
    if not isinstance(a["start"], (int, float)):
        raise _LimitExceeded("chat templates may only sum numbers")


def _pre_tojson(budget: _Budget, a: dict[str, Any]) -> None:
    if isinstance(a["indent"], int) and a["indent"] > 16:
        raise _LimitExceeded("chat template tojson indent is too large")
    budget.charge(2 * _text_size(a["value"], budget.chars_left))


def _pre_stringify(budget: _Budget, a: dict[str, Any]) -> None:
    budget.charge(_text_size(next(iter(a.values())), budget.chars_left))


_FILTER_CHECKS: dict[str, Callable[[_Budget, dict[str, Any]], None]] = {
    "batch": lambda budget, a: _check_width(budget, a["linecount"]),
    "center": lambda budget, a: _check_width(budget, a["width"]),
    "format": _pre_format,
    "indent": _pre_indent,
    "join": _pre_join,
    "replace": _pre_replace,
    "slice": lambda budget, a: _check_width(budget, a["slices"]),
    "string": _pre_stringify,
    "sum": _pre_sum,
    "tojson": _pre_tojson,
}
# Filters whose output is small or bounded by their input, in time roughly linear in it. Not offered:
# `wordwrap` (a minute on a 1 MB word), `urlize` and `pprint` (super-linear on crafted input), `unique`
# (quadratic on integers crafted to share one hash), and anything a newer jinja2 adds.
_PLAIN_FILTERS = (
    "abs attr capitalize count d default dictsort e escape filesizeformat first float forceescape groupby "
    "int items last length list lower map max min random reject rejectattr reverse round safe select "
    "selectattr sort striptags title trim truncate upper urlencode wordcount xmlattr"
).split()
_CONTEXT_PARAMETERS = ("context", "eval_ctx", "environment")


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    check = _FILTER_CHECKS.get(name)
    lead = 1 if hasattr(func, "jinja_pass_arg") else 0  # the context/environment jinja2 passes first
    signature = inspect.signature(func)
    parameters = list(signature.parameters.values())
    if lead and parameters and parameters[0].name in _CONTEXT_PARAMETERS:
        signature = signature.replace(parameters=parameters[1:])

    @functools.wraps(func)  # keeps jinja_pass_arg
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        if len(args) > lead:
            args = (*args[:lead], _materialize(budget, args[lead]), *args[lead + 1 :])
        if check is not None:
            try:
                bound = signature.bind(*args[lead:], **kwargs)
            except TypeError:
                pass  # the filter call below raises the same error
            else:
                bound.apply_defaults()
                check(budget, bound.arguments)
        result = func(*args, **kwargs)
        budget.charge_value(result)
        return result

    return guarded


# ---- compile-time instrumentation ---------------------------------------------------------------------


def _literal_chars(node: nodes.Node) -> int:
    """Characters of template text in `node`, not counting nested loop or macro bodies (they charge their own)."""
    if isinstance(node, nodes.TemplateData):
        return len(node.data)
    total = 0
    for child in node.iter_child_nodes():
        if not isinstance(child, (nodes.For, nodes.Macro, nodes.CallBlock)):
            total += _literal_chars(child)
    return total


def _hook(name: str, args: list[nodes.Expr], lineno: int | None = None) -> nodes.Call:
    """A call of `environment.<name>(*args)`, compiled as a direct call (see visit_Call below)."""
    return nodes.Call(nodes.EnvironmentAttribute(name), args, [], None, None, lineno=lineno)


def _charge_statement(body: list[nodes.Node], lineno: int) -> nodes.ExprStmt:
    """Charged on every execution of `body`: one step plus the template text the body emits."""
    chars = sum(_literal_chars(n) for n in body)
    return nodes.ExprStmt(_hook("hymt_enter", [nodes.Const(chars)], lineno), lineno=lineno)


class _Instrument(NodeTransformer):
    """Charge every loop iteration, loop test, macro call and `~` concatenation to the render budget."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.body.insert(0, _charge_statement(node.body, node.lineno))
        if node.test is not None:
            # hymt_enter returns None, so `not hymt_enter(0) and test` is the test.
            check = nodes.Not(_hook("hymt_enter", [nodes.Const(0)]))
            node.test = nodes.And(check, node.test, lineno=node.lineno)
        return node

    def visit_Macro(self, node: nodes.Macro) -> nodes.Node:
        self.generic_visit(node)
        node.body.insert(0, _charge_statement(node.body, node.lineno))
        return node

    def visit_CallBlock(self, node: nodes.CallBlock) -> nodes.Node:
        self.generic_visit(node)
        node.body.insert(0, _charge_statement(node.body, node.lineno))
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _hook("hymt_concat", node.nodes, node.lineno)


class _InstrumentingCodeGenerator(CodeGenerator):
    def visit_Template(self, node: nodes.Template, frame: Any = None) -> None:
        _Instrument().visit(node)
        super().visit_Template(node, frame)

    def visit_Call(self, node: nodes.Call, frame: Any, **kwargs: Any) -> None:
        # The budget hooks are called directly rather than through the sandbox's call(): they run on every
        # loop iteration. Templates cannot name them (EnvironmentAttribute nodes come only from here).
        if isinstance(node.node, nodes.EnvironmentAttribute) and node.node.name.startswith("hymt_"):
            self.write(f"environment.{node.node.name}(")
            for index, arg in enumerate(node.args):
                self.write(", " if index else "")
                self.visit(arg, frame)
            self.write(")")
            return
        super().visit_Call(node, frame, **kwargs)


class _Sandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, default options, plus the render budget hooks."""

    code_generator_class = _InstrumentingCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%", "//", "/"})

    def __init__(self) -> None:
        super().__init__(finalize=self._finalize)
        self.globals = {
            "range": self.globals["range"],
            "dict": _keyword_dict,
            "namespace": _keyword_namespace,
            "cycler": self.globals["cycler"],
            "joiner": self.globals["joiner"],
            "raise_exception": _raise_exception,
        }
        self.filters = {
            name: _guard_filter(name, self.filters[name]) for name in (*_PLAIN_FILTERS, *_FILTER_CHECKS)
        }

    @staticmethod
    def hymt_enter(chars: int) -> None:
        budget = _budget()
        budget.tick()
        budget.charge(chars)

    @staticmethod
    def hymt_concat(*values: Any) -> str:
        budget = _budget()
        budget.tick()
        budget.charge(sum(_text_size(v, budget.chars_left) for v in values))
        return "".join(map(str, values))

    @staticmethod
    def _finalize(value: Any) -> Any:
        budget = _BUDGET.get()
        if budget is not None:  # None: constant output folded at compile time (bounded by the source)
            budget.tick()
            budget.charge(_text_size(value, budget.chars_left))
        return value

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.tick()
        _check_binop(budget, operator, left, right)
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = _budget()
        budget.tick()
        result = super().getitem(obj, argument)
        if isinstance(argument, slice):
            budget.charge_value(result)
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt: str = value.__self__
        is_map = value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> str:
            budget = _budget()
            mapping = args[0] if is_map and args else kwargs
            _check_str_format(
                budget, fmt, () if is_map else args, mapping if isinstance(mapping, dict) else {}
            )
            return wrapper(*args, **kwargs)

        return checked

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _budget()
        budget.tick()
        args = _check_method(budget, __obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        budget.charge_value(result)
        return result


def _keyword_dict(**items: Any) -> dict[str, Any]:
    """`dict(a=1)` only: keys are then identifiers, so no crafted hash collisions (built from a list of
    integer pairs, a dict can take quadratic time)."""
    return items


def _keyword_namespace(**attributes: Any) -> Namespace:
    """`namespace(a=1)` only, for the same reason as `_keyword_dict`."""
    return Namespace(**attributes)


def _raise_exception(message: Any) -> None:
    raise _Raised(str(message))


_ENVIRONMENT = _Sandbox()


class ChatTemplate:
    """A compiled chat template with its resource limits; `render` is the usual entry point."""

    def __init__(self, source: str, limits: RenderLimits = DEFAULT_LIMITS) -> None:
        if not isinstance(source, str):
            raise TemplateError("chat template must be a string")
        if len(source) > limits.max_template_chars:
            raise TemplateError(f"chat template exceeds {limits.max_template_chars} characters")
        self.source = source
        self.limits = limits
        try:
            self._template = _ENVIRONMENT.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"invalid chat template: {exc.message} (line {exc.lineno})") from None
        except (jinja2.TemplateError, RecursionError) as exc:
            raise TemplateError(f"invalid chat template: {exc}") from None

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        bos_token: str,
        eos_token: str,
        add_generation_prompt: bool = True,
        **variables: Any,
    ) -> str:
        """Render `messages` (role + string or text-part content) with the §7 variables."""
        flat = _check_messages(messages)
        context: dict[str, Any] = {"tools": [], "reasoning_effort": "no_think"}
        context.update(variables)
        context.update(
            messages=flat,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
        input_chars = sum(len(m["content"]) for m in flat)
        limits = self.limits
        budget = _Budget(
            steps_left=limits.max_steps
            + limits.steps_per_message * len(flat)
            + limits.steps_per_input_char * input_chars,
            chars_left=limits.max_chars + limits.chars_per_input_char * input_chars,
            deadline=time.monotonic() + limits.max_seconds,
            limits=limits,
        )
        token = _BUDGET.set(budget)
        try:
            chunks = []
            for chunk in self._template.generate(context):
                budget.tick()
                chunks.append(chunk)
            return "".join(chunks)
        except _Raised as exc:
            raise TemplateError(str(exc)) from None
        except _LimitExceeded as exc:
            raise TemplateError(str(exc)) from None
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"chat template refused: {exc}") from None
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template failed: {exc}") from None
        except RecursionError:
            raise TemplateError("chat template recursed too deeply") from None
        except MemoryError:
            raise TemplateError("chat template ran out of memory") from None
        except Exception as exc:  # noqa: BLE001 — any error inside an untrusted template is a template error
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None
        finally:
            _BUDGET.reset(token)


@functools.lru_cache(maxsize=32)
def _compiled(source: str) -> ChatTemplate:
    return ChatTemplate(source)


def flatten_content(content: Any) -> str:
    """A message content as text: a string, or text parts concatenated with no separator."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise TemplateError("only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise TemplateError("message content must be a string or a list of text parts")


def _check_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, (list, tuple)):
        raise TemplateError('messages must be a list of {"role": ..., "content": ...} objects')
    if not messages:
        raise TemplateError("messages must not be empty")
    flat = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise TemplateError("each message needs a role of system, user or assistant")
        if message["role"] == "system" and index > 0:
            raise TemplateError("system message must be first")
        flat.append({"role": message["role"], "content": flatten_content(message.get("content"))})
    return flat


def render(
    template: str,
    messages: list[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """Render a chat template source (compiled once per distinct source) with the §7 context."""
    return _compiled(template).render(
        messages,
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
        **variables,
    )


def render_chat(tokenizer: Tokenizer, messages: list[dict[str, Any]]) -> str:
    """Render `messages` with the tokenizer's GGUF template and its BOS/EOS strings."""
    return render(
        tokenizer.chat_template, messages, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token
    )
