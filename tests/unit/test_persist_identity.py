"""How a kept session is named on disk (SPEC 12): by name when it has one, else by id,
so a snapshot is only ever restored into the session that wrote it."""

from __future__ import annotations

from coordex.persist.store import Identity


def test_a_named_session_is_the_same_session_whatever_its_id() -> None:
    kept = Identity("python", None, 3, "audit")
    assert kept.same_session(Identity("python", None, 1, "audit"))
    assert not kept.same_session(Identity("python", None, 3, None))
    assert not kept.same_session(Identity("bash", None, 3, "audit"))
    assert not kept.same_session(Identity("python", 2, 3, "audit"))


def test_an_unnamed_session_is_its_id() -> None:
    assert Identity("bash", 1, 0, None).same_session(Identity("bash", 1, 0, None))
    assert not Identity("bash", 1, 0, None).same_session(Identity("bash", 1, 2, None))


def test_folders_never_clash_and_hold_no_path_separators() -> None:
    identities = [Identity("python", None, 0, None), Identity("python", 1, 0, None),
                  Identity("bash", None, 0, None), Identity("python", None, 1, "a/b"),
                  Identity("python", None, 1, "a_b"), Identity("python", None, 1, "..")]
    slugs = [i.slug() for i in identities]
    assert len(set(slugs)) == len(slugs)
    assert all("/" not in s and s not in (".", "..") for s in slugs)
    assert Identity.of({"language": "python", "venv_id": None, "session_id": 4,
                        "session_name": "x"}) == Identity("python", None, 4, "x")
