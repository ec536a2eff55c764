"""Chat templates (REFERENCE.md §7, §12.7): official renderings, context variables, sandbox and limits."""

from __future__ import annotations

import json

import pytest
from shared_data import shared_file

from hymt import chat
from hymt.chat import ChatTemplate, RenderLimits, flatten_content, render
from hymt.errors import TemplateError

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def official() -> dict:
    return json.loads(shared_file("fixtures", "tokenizers.json").read_text())


@pytest.mark.parametrize("key", ["1.8b", "7b", "30b"])
@pytest.mark.parametrize("index", range(4))
def test_official_templates_render_exactly(official, key, index):
    data = official[key]
    case = data["cases"][index]
    rendered = render(
        data["template"], case["messages"], bos_token=data["bos_token"], eos_token=data["eos_token"]
    )
    assert rendered == case["rendered"]


def test_generation_prompt_and_variables_reach_the_template(official):
    small, big = official["1.8b"], official["30b"]
    without = render(small["template"], USER, bos_token="B", eos_token="E", add_generation_prompt=False)
    assert without.endswith("<｜hy_place▁holder▁no▁8｜>")
    high = render(big["template"], USER, bos_token="B", eos_token="E", reasoning_effort="high")
    assert high.endswith("reasoning_effort:high<｜hy_User｜>hi<｜hy_Assistant｜><think>")
    tools = render(big["template"], USER, bos_token="B", eos_token="E", tools=[{"name": "f"}])
    assert "# Tools" in tools and '{"name": "f"}' in tools  # tojson works inside the sandbox


def test_official_templates_fit_default_limits_for_long_conversations(official):
    turns = [{"role": "system", "content": "Translate."}]
    for i in range(300):
        turns.append({"role": "user", "content": f"sentence {i} " * 20})
        turns.append({"role": "assistant", "content": f"Satz {i} " * 20})
    for data in official.values():
        out = render(data["template"], turns, bos_token=data["bos_token"], eos_token=data["eos_token"])
        assert "sentence 299" in out and "Satz 299" in out


def test_content_parts_are_flattened(official):
    data = official["1.8b"]
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world."}]}
    ]
    plain = [{"role": "user", "content": "Hello, world."}]
    kwargs = {"bos_token": data["bos_token"], "eos_token": data["eos_token"]}
    assert render(data["template"], parts, **kwargs) == render(data["template"], plain, **kwargs)
    assert flatten_content("x") == "x"
    assert flatten_content([]) == ""
    for bad in ([{"type": "image_url", "image_url": {"url": "x"}}], [{"type": "text", "text": 3}], ["x"]):
        with pytest.raises(TemplateError, match="^only text content parts are supported$"):
            flatten_content(bad)
    with pytest.raises(TemplateError, match="^only text content parts are supported$"):
        render(data["template"], [{"role": "user", "content": [{"type": "input_audio"}]}], **kwargs)


def test_message_prechecks():
    with pytest.raises(TemplateError, match="^messages must not be empty$"):
        render("x", [], bos_token="", eos_token="")
    late_system = [*USER, {"role": "system", "content": "s"}]
    with pytest.raises(TemplateError, match="^system message must be first$"):
        render("x", late_system, bos_token="", eos_token="")
    # A library user passing a prompt string (or one message dict) is told what to pass instead of being
    # told that the messages are empty.
    for not_a_list in ("Translate: hello", {"role": "user", "content": "hi"}, None):
        with pytest.raises(TemplateError, match="^messages must be a list of"):
            render("x", not_a_list, bos_token="", eos_token="")


def test_raise_exception_surfaces_its_message():
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user') }}{% endif %}"
    with pytest.raises(TemplateError, match="^Conversation must start with a user$"):
        render(template, [{"role": "assistant", "content": "a"}], bos_token="", eos_token="")


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("A\n", "A"),  # jinja2 drops a single trailing newline of the source
        ("A\n\n", "A\n"),
        ("{% if true %}\nB{% endif %}", "\nB"),  # no trim_blocks
        ("  {% if true %}C{% endif %}", "  C"),  # no lstrip_blocks
        ("{{ messages[0].content }}", "<b>&amp;</b>'"),  # no autoescape
        ("{{ nothing }}x{{ nothing is defined }}", "xFalse"),  # default Undefined prints nothing
        ("{{ bos_token }}|{{ eos_token }}|{{ tools|length }}|{{ reasoning_effort }}", "<s>|</s>|0|no_think"),
        (
            "{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}{{ dict(b=2)|tojson }}",
            '2{"b": 2}',
        ),
    ],
)
def test_jinja2_defaults(template, expected):
    messages = [{"role": "user", "content": "<b>&amp;</b>'"}]
    assert render(template, messages, bos_token="<s>", eos_token="</s>") == expected


def test_templates_compile_once():
    source = "{{ messages|length }} compiled once"
    assert chat._compiled(source) is chat._compiled(source)
    assert render(source, USER, bos_token="", eos_token="") == "1 compiled once"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for %}", "invalid chat template: "),
        ("{{ foo() }}", "chat template failed: 'foo' is undefined"),
        ("{{ 1 // 0 }}", "chat template failed: ZeroDivisionError"),
        ("{% include 'other' %}", "chat template failed: "),
        ("{{ lipsum(10) }}", "chat template failed: 'lipsum' is undefined"),
        ("{{ 'a b'|wordwrap(1) }}", "invalid chat template: No filter named 'wordwrap'"),
        ("{{ 'x'|urlize }}", "invalid chat template: No filter named 'urlize'"),
        ("{{ [1]|pprint }}", "invalid chat template: No filter named 'pprint'"),
        ("{{ [1]|unique|list }}", "invalid chat template: No filter named 'unique'"),
        ("{{ dict([[1, 2]]) }}", "chat template failed: TypeError"),
        ("{{ namespace({'a': 1}).a }}", "chat template failed: TypeError"),
    ],
)
def test_template_errors(template, message):
    with pytest.raises(TemplateError) as error:
        render(template, USER, bos_token="", eos_token="")
    assert str(error.value).startswith(message)


def test_template_source_size_limit():
    with pytest.raises(TemplateError, match="^chat template exceeds 100 characters$"):
        ChatTemplate("x" * 101, RenderLimits(max_template_chars=100))


# ---- the sandbox: no Python internals ------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''.__class__ }}",
        "{{ ''['__class__'] }}",
        "{{ ''|attr('__class__') }}",
        "{{ '{0.__class__}'.format('') }}",
        "{{ '{a.__class__}'.format_map({'a': 1}) }}",
        "{{ self.__init__.__globals__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ namespace.__init__ }}",
        "{{ range.__globals__ }}",
        "{{ raise_exception.__globals__ }}",
        "{% for x in [1] %}{{ loop.__class__ }}{% endfor %}",
        "{{ messages.append(1) }}",
        "{% set d = {} %}{{ d.update({'a': 1}) }}",
        "{{ messages[0].pop('role') }}",
        "{{ (messages|first).clear() }}",
    ],
)
def test_sandbox_refuses_python_internals(template):
    with pytest.raises(TemplateError, match="^chat template refused: "):
        render(template, USER, bos_token="", eos_token="")


# ---- the render budget -----------------------------------------------------------------------------------

SMALL = RenderLimits(max_steps=20_000, max_chars=200_000, max_seconds=30.0)
STEP = "chat template exceeded its step limit"
SIZE = "chat template exceeded its output size limit"
WIDTH = "chat template format width is too large"
BIG_INT = "chat template integer is too large"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", STEP),
        ("{% for i in range(100000) %}{% for j in range(100000) if false %}{% endfor %}{% endfor %}", STEP),
        ("{% for x in range(20) recursive %}{% if x %}{{ loop(range(x)) }}{% endif %}{% endfor %}", STEP),
        ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}", STEP),
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "chat template recursed too deeply"),
        ("{{ 'a' * 1000000000 }}", SIZE),
        ("{% set n = 1000000000 %}{{ [1] * n }}", SIZE),
        ("{{ 'a'|center(1000000000) }}", SIZE),
        ("{{ 'a'.center(1000000000) }}", SIZE),
        ("{{ 'a'.ljust(1000000000) }}", SIZE),
        ("{{ 'a'.zfill(1000000000) }}", SIZE),
        ("{{ ('\t' * 1000).expandtabs(100000000) }}", SIZE),
        ("{{ (1).to_bytes(1000000000, 'big') }}", SIZE),
        ("{{ '{:>1000000000}'.format(1) }}", WIDTH),
        ("{{ '{:{w}}'.format(1, w=1000000000) }}", WIDTH),
        ("{{ '%1000000000d' % 1 }}", WIDTH),
        ("{{ '%*d' % (1000000000, 1) }}", WIDTH),
        ("{{ '%.1000000000f'|format(1.0) }}", WIDTH),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            SIZE,
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
            SIZE,
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set t %}{{ ns.s }}{{ ns.s }}{% endset %}"
            "{% set ns.s = t %}{% endfor %}",
            SIZE,
        ),
        (
            "{% macro twice(s) %}{{ s }}{{ s }}{% endmacro %}{% set ns = namespace(s='x') %}"
            "{% for i in range(64) %}{% set ns.s = twice(ns.s) %}{% endfor %}",
            SIZE,
        ),
        ("{% set big = 'x' * 100000 %}{% set l = [big] * 10 %}{{ l|join }}", SIZE),
        ("{% set big = 'x' * 100000 %}{{ ([big] * 10)|map('upper')|list|length }}", SIZE),
        ("{% set big = 'x' * 100000 %}{{ ([big] * 10)|map('upper')|join }}", SIZE),
        ("{{ ('x' * 10000)|replace('', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}", SIZE),
        ("{{ ('x' * 10000).replace('', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') }}", SIZE),
        ("{{ ('\n' * 10000)|indent(10000) }}", SIZE),
        ("{{ [1]|batch(1000000000, 'x')|list }}", SIZE),
        ("{{ [1]|slice(1000000000)|list }}", SIZE),
        ("{% for i in range(100000) %}" + "x" * 1000 + "{% endfor %}", SIZE),
        ("{{ [[1]] * 1000|sum(start=[]) }}", "chat templates may only sum numbers"),
        ("{% set l = [[1] * 1000] * 1000 %}{{ l }}", SIZE),
        ("{{ (['x'] * 1000)|tojson(indent=100000) }}", "chat template tojson indent is too large"),
        ("{{ 'abc'.translate({97: 'x' * 100000}) }}", "chat templates may not call str.translate"),
        (
            "{% set ns = namespace(x=2**60000) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
            BIG_INT,
        ),
        ("{{ 7 ** 1000000 }}", BIG_INT),
    ],
)
def test_render_limits(template, message):
    with pytest.raises(TemplateError) as error:
        ChatTemplate(template, SMALL).render(USER, bos_token="", eos_token="")
    assert str(error.value).startswith(message)


def test_wall_clock_limit():
    limits = RenderLimits(max_steps=10**12, max_seconds=0.05)
    template = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="^chat template exceeded its time limit$"):
        ChatTemplate(template, limits).render(USER, bos_token="", eos_token="")


def test_budget_grows_with_the_input():
    """Templates that touch each input character a few times scale with long messages."""
    template = "{% for c in messages[0].content %}{{ c }}{% endfor %}{{ messages[0].content|upper }}"
    limits = RenderLimits(max_steps=1000, max_chars=1000)
    text = "a" * 50_000
    out = ChatTemplate(template, limits).render(
        [{"role": "user", "content": text}], bos_token="", eos_token=""
    )
    assert out == text + text.upper()


def test_a_failed_render_leaves_no_budget_behind():
    hostile = ChatTemplate("{{ 'a' * 1000000000 }}", SMALL)
    with pytest.raises(TemplateError):
        hostile.render(USER, bos_token="", eos_token="")
    assert chat._BUDGET.get() is None
    assert render("{{ messages[0].content }}", USER, bos_token="", eos_token="") == "hi"


BIG = "{% set big = 'x' * 2000 %}"  # each template below would build 100-200 MB if it were allowed to run


@pytest.mark.parametrize(
    "template",
    [
        BIG + "{{ ([big] * 100000)|join }}",
        BIG + "{{ ([big] * 100000)|join(attribute='x') }}",
        BIG + "{{ ' '.join([big] * 100000) }}",
        BIG + "{{ ([big] * 100000)|map('upper')|list|length }}",
        BIG + "{{ ([big] * 100000)|map('upper')|join }}",
        BIG + "{{ ' '.join(([big] * 100000)|map('upper')) }}",
        BIG + "{% for x in ([big] * 100000)|map('upper') %}{{ x }}{% endfor %}",
        BIG + "{{ ([big] * 100000)|tojson }}",
        BIG + "{{ ([big] * 100000)|string }}",
        BIG + "{{ [big] * 100000 }}",
        BIG + "{{ '%s' % ([big] * 100000) }}",
        BIG + "{{ ([big] * 100000) ~ '' }}",
        "{{ 'a'|center(200000000) }}",
        "{{ 'a'.rjust(200000000) }}",
        "{{ 'ab' * 100000000 }}",
        "{{ ('x' * 10000)|replace('', 'y' * 20000) }}",
        "{{ ('\n' * 10000)|indent(20000) }}",
        "{{ ('\n' * 10000)|indent(width=20000) }}",
        "{{ (1).to_bytes(200000000, 'big') }}",
        "{{ [1]|batch(linecount=200000000, fill_with='x')|list }}",
    ],
)
def test_amplifying_operations_are_refused_before_allocating(template):
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(TemplateError, match="exceeded its output size limit"):
            ChatTemplate(template, SMALL).render(USER, bos_token="", eos_token="")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 << 20
