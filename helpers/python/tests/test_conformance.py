"""The shared sign-off conformance cases (helpers/conformance/signoff.json,
docs/helpers.md), run against this package: every case of the file, by its
name. The Ruby and Node.js helpers run the same file with their own test
runners. No database."""
import json
import pathlib

import pytest

import pg_idempotency as idem

CASES = json.loads((pathlib.Path(__file__).resolve().parents[2] / "conformance" / "signoff.json")
                   .read_text(encoding="utf-8"))
VARIABLES = ("IDEMPOTENCY_SIGNOFF", "IDEMPOTENCY_SIGNOFF_JOB_TYPES", "IDEMPOTENCY_SIGNOFF_LEASE",
             "IDEMPOTENCY_SIGNOFF_HELLO")


def by_name(section):
    return pytest.mark.parametrize("case", CASES[section], ids=[c["name"] for c in CASES[section]])


def environment(monkeypatch, env):
    """the case's environment (a variable it does not name is unset), read
    again by the package as a new process would"""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    idem._signoff = None


def test_the_protocol_version():
    assert idem.SIGNOFF_VERSION == CASES["protocol_version"]


@by_name("job_types")
def test_job_types(case, monkeypatch):
    environment(monkeypatch, case["env"])
    text = case["env"].get("IDEMPOTENCY_SIGNOFF_JOB_TYPES")
    if "refusal" in case:
        with pytest.raises(idem.SignoffError) as parsed:
            idem.parse_job_types(text)
        assert str(parsed.value) == case["refusal"]
        with pytest.raises(idem.SignoffError) as looked_up:   # as every call of the package
            idem.signoff_job_type("a")
        assert str(looked_up.value) == case["refusal"]
        return
    assert idem.parse_job_types(text) == case["map"]
    for yours, used in case["lookups"].items():
        assert idem.signoff_job_type(yours) == used


@by_name("lease")
def test_lease(case, monkeypatch):
    environment(monkeypatch, case["env"])
    text = case["env"].get("IDEMPOTENCY_SIGNOFF_LEASE")
    if "refusal" in case:
        with pytest.raises(idem.SignoffError) as parsed:
            idem.parse_lease(text)
        assert str(parsed.value) == case["refusal"]
        with pytest.raises(idem.SignoffError) as read:
            idem.signoff_lease()
        assert str(read.value) == case["refusal"]
        return
    assert idem.parse_lease(text) == case["lease"]
    assert idem.signoff_lease() == case["lease"]


@by_name("messages")
def test_messages(case):
    given = dict(case["input"])
    point, job_type, key = given.pop("point"), given.pop("job_type"), given.pop("key")
    if "error" in case:
        with pytest.raises(ValueError) as e:
            idem.signoff_message(point, job_type, key, **given)
        assert str(e.value) == case["error"]
        return
    line = idem.signoff_message(point, job_type, key, **given)
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line) == case["line"]


@by_name("hello_armed")
def test_hello_armed(case, monkeypatch):
    environment(monkeypatch, case["env"])
    assert idem.signoff_hello_armed() is case["hello"]


@by_name("hellos")
def test_hellos(case):
    given = dict(case["input"])
    line = idem.signoff_hello_message(**given)
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line) == case["line"]
    assert list(json.loads(line)) == list(case["line"])   # the fields in the documented order


@by_name("answers")
def test_answers(case):
    if "error" in case:
        with pytest.raises(idem.SignoffError) as e:
            idem.signoff_answer(case["point"], case["received"])
        assert str(e.value) == case["error"]
        with pytest.raises(idem.SignoffError) as e:   # the exchange's error names where
            idem.signoff_answer(case["point"], case["received"], "sign-off runner at /r.sock, point P of t/k")
        assert str(e.value) == "sign-off runner at /r.sock, point P of t/k: " + case["error"]
        return
    assert idem.signoff_answer(case["point"], case["received"]) == case["answer"]
