"""``POST /v1/warmstart/prefill`` on a real server (issue 40): a draft answers with the
tokens it made ready, and the reply after Enter finds them cached."""

from __future__ import annotations

import uuid

import httpx

from tests.api.conftest import Server

PASTE = " ".join(f"line {i} of the pasted report says {i * 7 % 13} apples" for i in range(60))


def _body(question: str, **more: object) -> dict:
    return {"messages": [{"role": "user", "content": f"{PASTE}\n\n{question}"}], **more}


def test_a_draft_makes_its_certain_part_ready_for_enter(server: Server) -> None:
    headers = {"X-Warmstart-Session": f"draft-{uuid.uuid4()}"}
    drafted = httpx.post(
        server.v1 + "/warmstart/prefill", json=_body("How many app"), headers=headers, timeout=60
    )
    assert drafted.status_code == 200, drafted.text
    draft = drafted.json()
    assert draft["object"] == "warmstart.draft"
    assert draft["state"] == "ready", draft
    assert 0 < draft["ready_tokens"] == draft["certain_tokens"] <= draft["prompt_tokens"]
    reply = httpx.post(
        server.v1 + "/chat/completions",
        json=_body("How many apples?", max_tokens=4),
        headers=headers,
        timeout=60,
    ).json()
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= draft["ready_tokens"], (cached, draft)


def test_a_draft_with_a_bad_body_is_a_400_that_names_the_field(server: Server) -> None:
    response = httpx.post(server.v1 + "/warmstart/prefill", json={"messages": []}, timeout=30)
    assert response.status_code == 400
    assert "messages" in response.text
