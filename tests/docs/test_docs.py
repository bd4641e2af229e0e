"""The docs stay honest: every hookspec and every profile key is documented, the README example runs."""

from __future__ import annotations

import inspect
import re
import types
from collections import Counter
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pluggy
import pytest
from pydantic import BaseModel

from ctxkernel import hookspecs
from ctxkernel.default_plugins.basic import BasicSettings
from ctxkernel.profile import Profile
from ctxkernel.validate import CHECKS

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


def sections(text: str, level: str) -> dict[str, str]:
    """Heading text -> body, for headings of exactly ``level`` (e.g. '##')."""
    out: dict[str, str] = {}
    pattern = re.compile(rf"^{level} (.+)$", re.MULTILINE)
    matches = list(pattern.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        # a section ends at the next heading of the same or a higher level
        body = text[match.end() : end]
        higher = re.search(rf"^#{{1,{len(level) - 1}}} ", body, re.MULTILINE) if len(level) > 1 else None
        out[match.group(1).strip()] = body[: higher.start()] if higher else body
    return out


# -- hooks ---------------------------------------------------------------------------------------------
def hookspec_signatures() -> dict[str, str]:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    out = {}
    for name in dir(hookspecs):
        if pm.parse_hookspec_opts(hookspecs, name) is not None:
            params = inspect.signature(getattr(hookspecs, name)).parameters
            out[name] = f"{name}({', '.join(params)})"
    return out


def test_every_hookspec_has_a_section_titled_with_its_signature():
    text = (DOCS / "hooks.md").read_text()
    titles = {t.strip("`") for t in sections(text, "##")}
    specs = hookspec_signatures()
    assert specs, "no hookspecs found"
    missing = sorted(sig for sig in specs.values() if sig not in titles)
    assert not missing, f"docs/hooks.md lacks a section titled with these exact signatures: {missing}"
    documented = {t.split("(")[0] for t in titles if "(" in t}
    stale = sorted(documented - set(specs))
    assert not stale, f"docs/hooks.md documents hooks that no longer exist: {stale}"


def test_firstresult_hooks_say_so():
    text = (DOCS / "hooks.md").read_text()
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    body = {t.strip("`"): b for t, b in sections(text, "##").items()}
    for name, signature in hookspec_signatures().items():
        first = pm.parse_hookspec_opts(hookspecs, name)["firstresult"]
        assert ("*First result.*" in body[signature]) == first, (
            f"{signature}: first-result note does not match the hookspec"
        )


def test_every_hook_states_its_stability():
    text = (DOCS / "hooks.md").read_text()
    table = sections(text, "##")["Stability"]
    rows = dict(re.findall(r"^\| `(\w+)` \| (stable|provisional)\b", table, re.MULTILINE))
    assert set(rows) == set(hookspec_signatures()), "docs/hooks.md: the Stability table must list every hook once"


def test_architecture_has_the_lifecycle_diagram():
    text = (DOCS / "architecture.md").read_text()
    order = [text.find(step) for step in ("pre_step", "decorate_request", "model", "sanitize_reply", "commit")]
    assert all(i >= 0 for i in order)
    diagrams = [b for b in re.findall(r"```\n(.*?)```", text, re.DOTALL) if "pre_step" in b]
    assert diagrams, "docs/architecture.md needs the lifecycle diagram in a code block"
    lines = diagrams[0]
    hooks = ("pre_step(ctx", "decorate_request(ctx", "sanitize_reply(ctx", "commit(ctx")
    positions = [lines.find(s) for s in hooks]
    assert positions == sorted(positions) and positions[0] >= 0


# -- profile keys ----------------------------------------------------------------------------------------
def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, bool, bool]:
    """(model inside the annotation, is it a list of them, is it a dict)."""
    origin = get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False, False
    if origin in (list, tuple):
        inner, _, _ = _model_in(get_args(annotation)[0])
        return inner, True, False
    if origin is dict:
        return None, False, True
    if origin in (Union, types.UnionType):
        for arg in get_args(annotation):
            if arg is not type(None):
                return _model_in(arg)
    return None, False, False


def keys_of(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, info in model.model_fields.items():
        inner, is_list, _ = _model_in(info.annotation)
        if inner is not None and not is_list:
            keys.add(prefix + name)
            keys |= keys_of(inner, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def expected_tables() -> dict[str, set[str]]:
    """Heading -> keys, derived from the pydantic models alone."""
    tables: dict[str, set[str]] = {}
    for name, info in Profile.model_fields.items():
        inner, is_list, is_dict = _model_in(info.annotation)
        if is_dict:
            tables[f"[{name}.<name>]"] = set()
        elif is_list:
            tables[f"[[{name}]]"] = keys_of(inner)
        else:
            assert inner is not None, f"profile field {name} is neither a table nor a list of tables"
            tables[f"[{name}]"] = keys_of(inner)
    tables["[strategies.basic]"] = keys_of(BasicSettings)
    return tables


def documented_tables() -> dict[str, set[str]]:
    text = (DOCS / "profiles.md").read_text()
    out = {}
    for title, body in sections(text, "###").items():
        match = re.fullmatch(r"`(\[.+\])`", title)
        if match:
            out[match.group(1)] = set(re.findall(r"^\| `([^`]+)` \|", body, re.MULTILINE))
    return out


def test_profile_key_walk_sees_nested_keys():
    # guard the walker itself: it must see a nested model's keys and a list of tables
    tables = expected_tables()
    assert "match.provider" in tables["[[model_policies]]"]
    assert "context_window" in tables["[model]"]
    assert "[prices]" in tables and "input" in tables["[prices]"]


@pytest.mark.parametrize("table", sorted(expected_tables()))
def test_every_profile_key_is_documented(table):
    documented = documented_tables()
    assert table in documented, f"docs/profiles.md has no section titled `{table}`"
    expected = expected_tables()[table]
    missing = sorted(expected - documented[table])
    stale = sorted(documented[table] - expected)
    assert not missing, f"docs/profiles.md {table}: undocumented keys {missing}"
    assert not stale, f"docs/profiles.md {table}: documents keys that do not exist {stale}"


def test_no_documented_table_is_stale():
    assert set(documented_tables()) <= set(expected_tables())


def test_every_validation_check_is_documented():
    text = (DOCS / "profiles.md").read_text()
    body = sections(text, "##")["Validation"]
    rows = set(re.findall(r"^\| `([^`]+)` \|", body, re.MULTILINE))
    assert rows == set(CHECKS)


def test_ci_job_is_ten_lines_and_validates_strictly():
    text = (DOCS / "profiles.md").read_text()
    (job,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "jobs:" in b]
    assert len(job.strip().splitlines()) == 10
    # the job runs the repository's pre-commit hook, which is `ctxkernel validate --strict`
    assert "pre-commit run ctxkernel-validate --all-files" in job
    assert "entry: ctxkernel validate --strict" in (REPO / ".pre-commit-hooks.yaml").read_text()


# -- README ------------------------------------------------------------------------------------------------
def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert blocks, "README.md has no python example"
    return blocks[0]


def test_readme_names_the_two_commands_and_links_the_docs():
    text = (REPO / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    for doc in ("docs/architecture.md", "docs/hooks.md", "docs/profiles.md"):
        assert doc in text and (REPO / doc).exists()


def test_readme_example_is_at_most_20_lines():
    assert len(readme_example().strip().splitlines()) <= 20


def test_readme_example_runs_against_a_scripted_model(tmp_path, monkeypatch):
    from ctxkernel import Message, ScriptedModel, ToolCallBlock

    monkeypatch.setenv("CTXKERNEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CTXKERNEL_PROFILE", raising=False)
    monkeypatch.chdir(REPO)
    namespace: dict[str, Any] = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)  # our own README
    model = ScriptedModel(
        [
            Message.assistant("I'll run the tests", [ToolCallBlock("c1", "run_tests", {"path": "tests/"})]),
            "The parser test passes now.",
        ]
    )
    ran = []

    def run_my_tool(call):
        ran.append(call.name)
        return "1 passed"

    answer = namespace["run_turn"]("Fix the failing test in parser.py", model, run_my_tool)
    assert answer == "The parser test passes now."
    assert ran == ["run_tests"]
    session = namespace["session"]
    assert [n.role for n in session.surface] == ["user", "assistant", "tool", "assistant"]
    assert not session.turn_open


def test_every_module_over_700_lines_says_why_in_the_architecture_doc():
    # a module grows past 700 lines only with a reason a newcomer can read (docs/architecture.md)
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Modules over 700 lines", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+\.py)` \|", section, flags=re.M))
    long = {
        path
        for root in ("src", "plugins")
        for path in (REPO / root).rglob("*.py")
        if "tests" not in path.parts and len(path.read_text().splitlines()) > 700
    }
    missing = sorted(str(p.relative_to(REPO)) for p in long if not any(str(p).endswith("/" + name) for name in listed))
    assert missing == [], f"say in docs/architecture.md why these modules are over 700 lines: {missing}"
    stale = sorted(name for name in listed if not any(str(p).endswith("/" + name) for p in long))
    assert stale == [], f"these modules are no longer over 700 lines; take them out of the table: {stale}"


# -- where a module's tests are ------------------------------------------------------------------------
def named_test_exists(module: Path, src: Path, tests: list[Path], tests_root: Path, leaves: Counter[str]) -> bool:
    """Whether a test file is named after ``module`` (the rule docs/architecture.md states).

    ``test_<name>.py`` or ``test_<name>_<aspect>.py``: ``<name>`` is the module's path in its
    package joined by ``_`` (a plugin's short name first; a package's ``__init__`` is the package),
    or the module's own name when no other module of its distribution has it, or when the test lies
    in its package's test folder."""
    parts = list(module.relative_to(src).with_suffix("").parts)
    package, inner = parts[0], [p for p in parts[1:] if p != "__init__"]
    short = package.removeprefix("ctxkernel_") if package != "ctxkernel" else ""
    full = "_".join([short, *inner] if short else inner) or package

    def named(test: Path, name: str) -> bool:
        return test.stem == f"test_{name}" or test.stem.startswith(f"test_{name}_")

    if any(named(t, full) for t in tests):
        return True
    if not inner:
        return False
    folder = tests_root.joinpath(*inner[:-1])
    return any(named(t, inner[-1]) and (leaves[inner[-1]] == 1 or folder in t.parents) for t in tests)


def test_every_module_has_a_test_named_after_it_or_a_row_in_the_architecture_doc():
    # a newcomer finds a module's tests by its name, or in one table (docs/architecture.md)
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Where a module's tests are", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([^`]+\.py)` \| (.+) \|$", section, flags=re.M))
    distributions = [(REPO / "src", REPO / "tests")] + [
        (plugin / "src", plugin / "tests")
        for plugin in sorted((REPO / "plugins").glob("*"))
        if (plugin / "src").is_dir()
    ]
    unnamed, test_roots = set(), {}
    for src, tests_root in distributions:
        modules = sorted(src.rglob("*.py"))
        tests = sorted(tests_root.rglob("test_*.py"))
        leaves = Counter(m.parent.name if m.stem == "__init__" else m.stem for m in modules)
        for module in modules:
            name = str(module.relative_to(src))
            test_roots[name] = REPO if src == REPO / "src" else tests_root
            if not named_test_exists(module, src, tests, tests_root, leaves):
                unnamed.add(name)
    missing = sorted(unnamed - set(rows))
    assert missing == [], f"name a test after these modules, or list their tests in docs/architecture.md: {missing}"
    gone = sorted(set(rows) - set(test_roots))
    assert gone == [], f"these modules no longer exist; take their rows out of docs/architecture.md: {gone}"
    named = sorted(set(rows) - unnamed)
    assert named == [], f"these modules have a test named after them now; take their rows out: {named}"
    for module, cell in rows.items():
        files = re.findall(r"`([^`]+\.py)`", cell)
        assert files or "empty package" in cell, f"{module}: name the test files that test it"
        assert len(files) <= 3, f"{module}: name at most the 3 most direct test files"
        absent = [f for f in files if not (test_roots[module] / f).is_file()]
        assert absent == [], f"{module}: these test files do not exist: {absent}"


def test_the_sizes_the_architecture_doc_gives_for_long_modules_are_current():
    """The table said ~710 lines for serve/wire.py and ~870 for simulate/replay.py when they had
    grown to ~1,230 and ~1,050: a figure within a tenth of the module's size stays."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Modules over 700 lines", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+\.py)` \| ~([\d,]+) \|", section, flags=re.M)
    assert len(rows) == len(re.findall(r"^\| `[^`]+\.py` \|", section, flags=re.M)), "each row gives ~<lines>"
    modules = [p for root in ("src", "plugins") for p in (REPO / root).rglob("*.py") if "tests" not in p.parts]
    wrong = []
    for name, stated in rows:
        (path,) = [p for p in modules if str(p).endswith("/" + name)]
        lines, figure = len(path.read_text().splitlines()), int(stated.replace(",", ""))
        if abs(figure - lines) > lines / 10:
            wrong.append(f"{name}: ~{stated} stated, {lines} lines")
    assert wrong == [], f"correct these sizes in docs/architecture.md: {wrong}"
