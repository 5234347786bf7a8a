"""coordex.toml read as meant or refused, and build failures sorted by cause (pure)."""

from __future__ import annotations

import pytest

from coordex.core.errors import CoordexError
from coordex.core.messages import build_cause, build_outside_spec
from coordex.core.settings import parse_settings


def test_build_env_values_become_environment_text() -> None:
    settings = parse_settings('[build.env]\nUV_INDEX_URL = "https://m/simple"\r\n'
                              "UV_OFFLINE = true\nUV_HTTP_TIMEOUT = 90\n")
    assert dict(settings.build_env) == {"UV_INDEX_URL": "https://m/simple", "UV_OFFLINE": "1",
                                        "UV_HTTP_TIMEOUT": "90"}
    assert dict(parse_settings("").build_env) == {}


@pytest.mark.parametrize(("text", "says"), [
    ("[build.env]\nUV_INDEX_URL = https://x\n", "line 2"),
    ("[build]\nindex = 'x'\n", "'index'"),
    ("[tool]\nx = 1\n", "'tool'"),
    ("[build.env]\n'A B' = 'x'\n", "'A B'"),
    ("[build.env]\nX = [1]\n", "list"),
])
def test_what_coordex_cannot_read_as_meant_is_refused(text: str, says: str) -> None:
    with pytest.raises(CoordexError) as caught:
        parse_settings(text, "root/coordex.toml")
    assert caught.value.error_type == "validation"
    assert "root/coordex.toml" in caught.value.error and says in caught.value.error
    assert caught.value.suggestion


@pytest.mark.parametrize(("reason", "cause"), [
    ("error: Failed to fetch: `https://pypi.org/simple/six/`\n  Caused by: invalid peer "
     "certificate: UnknownIssuer", "tls"),
    ("error: Request failed after 3 retries\n  Caused by: tcp connect error: Connection "
     "refused (os error 111)", "network"),
    ("Caused by: dns error: failed to lookup address information", "network"),
    ("Caused by: HTTP status client error (401 Unauthorized) for url (https://i/simple/x/)",
     "index_access"),
    ("error: Because six was not found in the package registry and you require six, we can "
     "conclude that your requirements are unsatisfiable.", None),
])
def test_uv_failures_are_sorted_by_cause(reason: str, cause: str | None) -> None:
    assert build_cause(reason) == cause


def test_a_tls_failure_names_the_certificate_setting_and_not_the_spec() -> None:
    error = build_outside_spec("environment venv_id=1", "error: Failed to fetch: "
                               "`https://pypi.org/simple/six/`\n  Caused by: invalid peer "
                               "certificate: UnknownIssuer", "home/coordex.toml")
    assert error is not None and error.error_type == "environment"
    assert "https://pypi.org/simple/six/" in error.error
    assert "SSL_CERT_FILE" in error.suggestion and "home/coordex.toml" in error.suggestion
    assert error.suggestion.startswith("The spec is fine")
