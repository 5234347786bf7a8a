"""Environment specs: the three text shapes, normalisation, hashing, and error messages.

Pure tests: ``coordex.core.spec`` touches neither disk nor processes.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordex.core.errors import CoordexError
from coordex.core.spec import EnvironmentSpec, parse_spec

WHEEL_URL = "file:///wheels/ledgerlib-1.0-py3-none-any.whl"

REQUIREMENTS = """\
# pinned for the ledger work
Ledger_Lib >= 1.0 , < 2   # comment after a requirement
pandas[excel,parquet]<2; python_version < "3.13"

ledgerlib @ file:///wheels/ledgerlib-1.0-py3-none-any.whl
"""

PYPROJECT = """\
[build-system]
requires = ["setuptools"]

[project]
name = "analysis"
version = "0.1"
requires-python = ">=3.10"
dependencies = [
    "ledger-lib<2,>=1.0",
    "PANDAS[parquet,excel] < 2 ; python_version<'3.13'",
    "ledgerlib @ file:///wheels/ledgerlib-1.0-py3-none-any.whl",
]
"""

SCRIPT = """\
import pandas as pd

# /// script
# requires-python = ">=3.10"
# dependencies = [
#   "ledger.lib>=1.0,<2",
#   "pandas[excel,parquet]<2; python_version < '3.13'",
#   "ledgerlib @ file:///wheels/ledgerlib-1.0-py3-none-any.whl",
# ]
# ///

print(pd.__version__)
"""


def invalid(text: str) -> CoordexError:
    with pytest.raises(CoordexError) as caught:
        parse_spec(text)
    assert caught.value.error_type == "validation"
    assert caught.value.suggestion
    return caught.value


# -- the three shapes ---------------------------------------------------------------------------


def test_requirements_list_is_normalised_sorted_and_commented_lines_dropped() -> None:
    spec = parse_spec(REQUIREMENTS)
    assert spec.kind == "requirements"
    assert spec.requires_python is None
    assert spec.requirements == (
        "ledger-lib<2,>=1.0",
        f"ledgerlib @ {WHEEL_URL}",
        'pandas[excel,parquet]<2; python_version < "3.13"',
    )


def test_pyproject_reads_pep621_dependencies_and_requires_python() -> None:
    spec = parse_spec(PYPROJECT)
    assert spec.kind == "pyproject"
    assert spec.requires_python == ">=3.10"
    assert "ledger-lib<2,>=1.0" in spec.requirements


def test_pep723_block_is_read_and_the_code_around_it_ignored() -> None:
    spec = parse_spec(SCRIPT)
    assert spec.kind == "script"
    assert spec.requires_python == ">=3.10"
    assert spec.requirements == parse_spec(PYPROJECT).requirements


def test_equal_specs_in_different_shapes_have_one_identity() -> None:
    script, pyproject = parse_spec(SCRIPT), parse_spec(PYPROJECT)
    assert script.normalised() == pyproject.normalised()
    assert script.spec_hash({"uv": "x"}) == pyproject.spec_hash({"uv": "x"})
    # requires-python is part of the identity: the bare list has none.
    assert parse_spec(REQUIREMENTS).normalised() != pyproject.normalised()


def test_script_without_dependencies_and_empty_text_are_empty_environments() -> None:
    assert parse_spec("# /// script\n# requires-python = '>=3.9'\n# ///\n").requirements == ()
    empty = parse_spec("")
    assert empty.requirements == () and empty.kind == "requirements"
    assert parse_spec("\n# only a comment\n").normalised() == empty.normalised()


def test_line_continuation_and_url_fragment_are_kept() -> None:
    spec = parse_spec(f"ledgerlib @ \\\n  {WHEEL_URL}#sha256=abc\n")
    assert spec.requirements == (f"ledgerlib @ {WHEEL_URL}#sha256=abc",)


def test_absolute_path_after_at_becomes_a_file_url() -> None:
    spec = parse_spec("ledgerlib @ /wheels/ledger+lib-1.0-py3-none-any.whl")
    assert spec.requirements == ("ledgerlib @ file:///wheels/ledger%2Blib-1.0-py3-none-any.whl",)


def test_duplicates_collapse() -> None:
    assert parse_spec("six\nSix\nsix  # again\n").requirements == ("six",)


# -- hashing ---------------------------------------------------------------------------------


def test_hash_covers_extra_inputs_but_not_their_order() -> None:
    spec = parse_spec("ledgerlib==1.0")
    a = spec.spec_hash({"python": "3.11.7", "uv": "0.9"})
    assert a == spec.spec_hash({"uv": "0.9", "python": "3.11.7"})
    assert a != spec.spec_hash({"python": "3.12.1", "uv": "0.9"})
    assert a != parse_spec("ledgerlib==2.0").spec_hash({"python": "3.11.7", "uv": "0.9"})
    assert len(a) == 64 and int(a, 16) >= 0


def test_kind_is_not_part_of_the_identity() -> None:
    a = EnvironmentSpec(("six",), None, "requirements")
    b = EnvironmentSpec(("six",), None, "pyproject")
    assert a.normalised() == b.normalised() and a.spec_hash() == b.spec_hash()


def test_requirements_txt_and_names() -> None:
    spec = parse_spec("B-Pkg==1\na_pkg[x]>=2\n")
    assert spec.requirements_txt() == "a-pkg[x]>=2\nb-pkg==1\n"
    assert spec.names() == ("a-pkg", "b-pkg")


_NAMES = st.sampled_from(["ledgerlib", "Ledger_Lib", "six", "pandas", "numpy", "a.b-c"])
_PINS = st.sampled_from(["", "==1.0", ">=1,<2", "<2, >=1", "~=1.4", "!=1.5"])


@given(st.lists(st.tuples(_NAMES, _PINS), min_size=1, max_size=6), st.randoms())
def test_order_and_spelling_do_not_change_the_identity(
        entries: list[tuple[str, str]], rnd: object) -> None:
    lines = [f"{name}{pin}" for name, pin in entries]
    shuffled = list(lines)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    first, second = parse_spec("\n".join(lines)), parse_spec("\n".join(shuffled))
    assert first.normalised() == second.normalised()
    # Normalising is idempotent: the normal form parses to itself.
    again = parse_spec("\n".join(first.requirements))
    assert again.requirements == first.requirements


# -- errors a model can act on ---------------------------------------------------------------------


def test_bad_requirement_line_is_named_and_quoted() -> None:
    error = invalid("ledgerlib==1.0\n\nnot a requirement!!\n")
    assert "Line 3" in error.error and "'not a requirement!!'" in error.error


def test_single_equals_suggests_double() -> None:
    error = invalid("ledgerlib=1.0")
    assert "Line 1" in error.error
    assert "'ledgerlib==1.0'" in error.suggestion


def test_bare_path_suggests_name_at_url() -> None:
    error = invalid("./dist/ledgerlib-1.0-py3-none-any.whl")
    assert "name @ URL" in error.suggestion


def test_relative_url_is_refused() -> None:
    error = invalid("ledgerlib @ dist/ledgerlib.whl")
    assert "file:///" in error.suggestion


def test_pip_options_are_refused_with_the_alternative() -> None:
    assert "UV_INDEX_URL" in invalid("--index-url https://example.org/simple\nsix").suggestion
    error = invalid("six\n-e ./src")
    assert "Line 2" in error.error and "'-e ./src'" in error.error


def test_pyproject_errors_name_the_line() -> None:
    error = invalid("[project]\nname = 'x'\ndependencies = [six]\n")
    assert "line 3" in error.error and "dependencies = [six]" in error.error
    error = invalid("[project]\ndependencies = 'six'\n")
    assert "must be a list" in error.error
    error = invalid("[tool.uv]\nindex-url = 'x'\n")
    assert "[project]" in error.error
    error = invalid("[project]\ndependencies = ['six', 'bad req here']\n")
    assert "dependencies[1]" in error.error and "line 2" in error.error
    error = invalid("[project]\nrequires-python = 'three'\n")
    assert "'three'" in error.error


def test_script_block_errors() -> None:
    error = invalid("x = 1\n# /// script\n# dependencies = [six]\n# ///\n")
    assert "line 3" in error.error  # the TOML error, mapped back to the whole text
    error = invalid("# /// script\n# dependencies = []\n")
    assert "not closed" in error.error and "'# ///'" in error.suggestion
    two = "# /// script\n# dependencies = []\n# ///\n"
    assert "2 '# /// script' blocks" in invalid(two + "x = 1\n" + two).error


def test_non_text_and_nul_are_refused() -> None:
    assert "must be text" in invalid(["six"]).error  # type: ignore[arg-type]
    assert "NUL" in invalid("six\x00").error


# -- read as meant or refused (SPEC section 5) -----------------------------------------------


def test_crlf_line_endings_read_like_lf() -> None:
    for text in (SCRIPT, PYPROJECT, REQUIREMENTS):
        crlf = parse_spec(text.replace("\n", "\r\n"))
        assert crlf.requirements and crlf == parse_spec(text)


@pytest.mark.parametrize("opener", ["# /// pyproject", "# /// requirements", "#/// script",
                                    "# ///script"])
def test_a_block_coordex_would_not_read_is_refused(opener: str) -> None:
    error = invalid(f"import six\n{opener}\n# dependencies = [\"six\"]\n# ///\n")
    assert "Line 2" in error.error and repr(opener) in error.error
    assert "'# /// script" in error.suggestion


def test_two_adjacent_script_blocks_say_there_are_two() -> None:
    block = "# /// script\n# dependencies = [\"six\"]\n# ///\n"
    error = invalid(block + block)
    assert "2 '# /// script' blocks (at lines 1, 4)" in error.error


@pytest.mark.parametrize(("table", "fragment"), [
    ("[tool.uv]\nindex-url = \"https://example.org/simple\"\n", "UV_INDEX_URL"),
    ("[[tool.uv.index]]\nurl = \"https://example.org/simple\"\n", "UV_INDEX_URL"),
    ("[tool.uv.sources]\nsix = { path = \"/wheels/six.whl\" }\n", "name @ URL"),
    ("[tool.uv]\nprerelease = \"allow\"\n", "Remove the [tool.uv] table"),
])
def test_tool_uv_settings_are_refused(table: str, fragment: str) -> None:
    text = "[project]\nname = \"x\"\nversion = \"0\"\ndependencies = [\"six\"]\n\n" + table
    error = invalid(text)
    assert "[tool.uv]" in error.error and "line 6" in error.error
    assert fragment.replace("name @ URL", "by URL") in error.suggestion
    script = "# /// script\n# dependencies = [\"six\"]\n" + "".join(
        f"# {line}\n" for line in table.splitlines()) + "# ///\n"
    assert "line 3" in invalid(script).error


@pytest.mark.parametrize("text", [
    "ledgerlib @ file://${WHEELS}/ledgerlib-1.0-py3-none-any.whl",
    "[project]\ndependencies = [\"ledgerlib @ file://${HOME}/w.whl\"]\n",
    "# /// script\n# dependencies = [\"six==${SIX_VERSION}\"]\n# ///\n",
])
def test_environment_variables_in_a_requirement_are_refused(text: str) -> None:
    error = invalid(text)
    assert "environment variable '${" in error.error and "Write the value itself" in error.suggestion
    assert "line 1" in error.error.lower() or "line 2" in error.error


def test_index_url_lines_are_refused_naming_the_line() -> None:
    error = invalid("six\n--index-url https://example.org/simple\n")
    assert "Line 2" in error.error and "UV_INDEX_URL" in error.suggestion


def test_tool_coordex_resources_are_read_but_not_hashed() -> None:
    text = PYPROJECT + "\n[tool.coordex]\nnum_cpus = 2\nnum_gpus = 0.5\nmemory = \"8GiB\"\n"
    spec = parse_spec(text)
    assert spec.resources == {"num_cpus": 2, "num_gpus": 0.5, "memory": 8 * 2**30}
    plain = parse_spec(PYPROJECT)
    assert plain.resources == {} and spec.spec_hash() == plain.spec_hash()
    assert parse_spec("[project]\n[tool.coordex]\nmemory = 1000\n").resources == {"memory": 1000}
    script = SCRIPT.replace("# ]\n", "# ]\n# [tool.coordex]\n# num_gpus = 1\n")
    assert parse_spec(script).resources == {"num_gpus": 1}
    assert parse_spec("[project]\n[tool.ruff]\nline-length = 90\n").resources == {}


@pytest.mark.parametrize(("table", "fragment"), [
    ("num_gpu = 1", "Did you mean 'num_gpus'?"),
    ("num_cpus = -1", "num_cpus = 2"),
    ("memory = \"lots\"", "8GiB"),
    ("num_gpus = true", "num_gpus = 2"),
])
def test_bad_tool_coordex_keys_are_refused(table: str, fragment: str) -> None:
    error = invalid(f"[project]\ndependencies = []\n[tool.coordex]\n{table}\n")
    assert "line 4" in error.error and fragment in error.suggestion
