"""The server's litmt extension fields ``prefix`` and ``constraints`` on /translate."""

from __future__ import annotations

import pytest

httpx = pytest.importorskip("httpx", reason="the serve extra is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from server_thread import ServerThread  # noqa: E402

from litmt.deploy.server.app import ServeConfig, build_server_app  # noqa: E402

DECODING = {"beam_size": 3}
PAIR = {"source": "en", "target": "de"}


@pytest.fixture(scope="module")
def client(ckpt):
    app = build_server_app(ckpt, device="cpu", settings=ServeConfig(decoding=DECODING))
    with ServerThread(app) as running, httpx.Client(base_url=running.url, timeout=60) as c:
        yield c


def test_prefix_and_constraints_fields(client, reference):
    q = ["A red dog runs.", "A big man sleeps here.", "A small cat eats today."]
    prefixes = ["Ein alter", None, "Ein kleiner"]
    constraints = [["heute"], None, ["Vogel"]]
    want = reference.translate(q, prefixes=prefixes, constraints=constraints, **DECODING)
    r = client.post(
        "/translate", json={"q": q, "prefix": prefixes, "constraints": constraints, **PAIR}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": want, "constraints_met": [True, True, True]}
    assert want[0].startswith("Ein alter") and "heute" in want[0] and "Vogel" in want[2]
    r = client.post(
        "/translate", json={"q": q[0], "prefix": "Ein alter", "constraints": ["heute"], **PAIR}
    )
    assert r.json() == {"translatedText": want[0], "constraints_met": True}
    r = client.post("/translate", data={"q": q[0], "prefix": "Ein alter", **PAIR})  # a form
    assert r.status_code == 200 and r.json()["translatedText"].startswith("Ein alter")
    plain = client.post("/translate", json={"q": q, **PAIR}).json()
    assert plain == {"translatedText": reference.translate(q, **DECODING)}  # the batched path


def test_unmet_constraints_are_flagged(client):
    """An empty text cannot hold its constraint: its answer is flagged, never passed off."""
    r = client.post(
        "/translate",
        json={"q": ["", "A red dog runs."], "constraints": [["Hund"], ["Hund"]], **PAIR},
    )
    assert r.status_code == 200, r.text
    assert r.json()["constraints_met"] == [False, True]
    assert r.json()["translatedText"][0] == "" and "Hund" in r.json()["translatedText"][1]


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"q": "A dog.", "constraints": "Hund"}, "the constraints of a sentence must be a list"),
        ({"q": "A dog.", "constraints": [""]}, "a constraint must not be empty"),
        ({"q": "A dog.", "prefix": 3}, "a prefix must be a string, got int"),
        (
            {"q": "A dog.", "constraints": ["Hund €"]},
            "the constraint 'Hund €' has characters the model's target vocabulary lacks: '€'",
        ),
        ({"q": "A dog.", "prefix": "€"}, "the prefix '€' has characters the model's target"),
        ({"q": ["A dog.", "A cat."], "prefix": ["Ein"]}, "prefix must be a list with one entry"),
        ({"q": "A dog.", "prefix": "Ein", "format": "html"}, "work with format=text only"),
        ({"q": "A dog.", "prefix": "Ein", "alternatives": 2}, "without alternatives"),
        ({"q": "A dog.\nA cat.", "prefix": "Ein"}, "must be one line within the model's"),
    ],
)
def test_bad_fields_are_a_400_with_one_line(client, request_fields, message):
    r = client.post("/translate", json={**request_fields, **PAIR})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]
    assert "\n" not in r.json()["error"]
