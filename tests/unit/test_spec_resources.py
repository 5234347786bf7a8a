"""``[tool.coordex]`` resources of a spec: read as numbers, refused otherwise (pure)."""

from __future__ import annotations

import pytest

from coordex.core.errors import CoordexError
from coordex.core.spec import parse_spec, spec_resources

PYPROJECT = '[project]\nname = "e"\nversion = "0"\ndependencies = ["ledgerlib==1.0"]\n'


def test_resources_are_read_from_tool_coordex() -> None:
    text = PYPROJECT + "\n[tool.coordex]\nnum_cpus = 2\nnum_gpus = 0.5\nmemory = 1073741824\n"
    assert spec_resources(text) == {"num_cpus": 2.0, "num_gpus": 0.5, "memory": 1073741824.0}


def test_no_table_zero_values_and_other_shapes_ask_for_nothing() -> None:
    assert spec_resources(PYPROJECT) == {}
    assert spec_resources(PYPROJECT + "[tool.coordex]\nnum_gpus = 0\n") == {}
    assert spec_resources("ledgerlib==1.0\n") == {}
    assert spec_resources('# /// script\n# dependencies = ["ledgerlib==1.0"]\n# ///\n') == {}


def test_resources_do_not_change_the_environment() -> None:
    asking = PYPROJECT + "[tool.coordex]\nnum_cpus = 4\n"
    assert parse_spec(asking).spec_hash() == parse_spec(PYPROJECT).spec_hash()


@pytest.mark.parametrize("value", ['"two"', "-1", "true", "[1]"])
def test_a_resource_that_is_not_a_number_is_refused_naming_the_line(value: str) -> None:
    text = PYPROJECT + f"[tool.coordex]\nnum_cpus = {value}\n"
    with pytest.raises(CoordexError) as caught:
        spec_resources(text)
    assert caught.value.error_type == "validation"
    assert "num_cpus" in caught.value.error and "line 6" in caught.value.error
    assert "num_cpus = 1" in caught.value.suggestion
