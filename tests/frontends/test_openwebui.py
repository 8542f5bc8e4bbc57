"""Open WebUI in a real browser, with warmstart as its Ollama and as its OpenAI connection.

A person's session: create the admin account, find warmstart's model in the picker,
ask, ask a follow-up, regenerate, start a second chat, go back to the first and ask
again. After each reply Open WebUI sends its own background requests (a title, tags,
follow-up suggestions) with other prompts; on a single-slot server they would evict the
chat's KV. Here the follow-up and the return to the first chat must find at least 90%
of their prompt cached, as warmstart reports it in the reply (``x_warmstart``), read by
the recording proxy between Open WebUI and warmstart, which also logs every route
Open WebUI calls and every 4xx/5xx.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.api.conftest import Server
from tests.api.inproc import serving

from .browser import OpenWebUI, browser_page
from .openwebui import open_webui
from .proxy import Exchange, Recorder, recording_app

MODEL = "smollm2-135m"
CACHED_SHARE = 0.9  # the bar for the follow-up and the return
# Other questions per connection: the two runs share one warmstart, and the second
# must not find its first question cached by the first.
QUESTIONS = {
    "ollama": (
        "Why is the sky blue? Explain the physics in detail.",
        "And why are sunsets red?",
        "Write a short poem about the moon.",
        "Sum up in one sentence what you told me about the sky.",
    ),
    "openai": (
        "How do volcanoes form? Explain the geology in detail.",
        "And why do some of them explode?",
        "Write a short poem about the sea.",
        "Sum up in one sentence what you told me about volcanoes.",
    ),
}


def _session(ui: OpenWebUI, questions: tuple[str, ...], shots: Path) -> None:
    """The user's steps; each waits for the reply and the background tasks after it."""
    labels = ui.models_in_picker()
    assert any(MODEL in label for label in labels), labels
    ui.page.screenshot(path=shots / "picker.png")
    ui.pick_model(next(label for label in labels if MODEL in label))
    ui.send(questions[0])
    ui.settle(chats=1)
    first_chat = ui.chat_path()
    ui.send(questions[1])
    ui.settle(chats=2)
    ui.regenerate()
    ui.settle(chats=3)
    ui.page.screenshot(path=shots / "first-chat.png")
    ui.new_chat()
    ui.send(questions[2])
    ui.settle(chats=4)
    ui.open_chat(first_chat)
    ui.send(questions[3])
    ui.settle(chats=5)
    ui.page.screenshot(path=shots / "return.png")


def _share(exchange: Exchange) -> float:
    return exchange.cached_tokens / max(1, exchange.prompt_tokens)


def _summary(kind: str, exchanges: list[Exchange]) -> dict[str, object]:
    chats = [e for e in exchanges if e.is_user_chat]
    first, follow_up = exchanges.index(chats[0]), exchanges.index(chats[1])
    return {
        "connection": kind,
        "routes": sorted({f"{e.method} {e.path}" for e in exchanges}),
        "errors": [e.line() for e in exchanges if e.status >= 400],
        "background_requests": sum(e.is_task for e in exchanges),
        "background_before_follow_up": sum(e.is_task for e in exchanges[first:follow_up]),
        "chats": [f"{e.cached_tokens}/{e.prompt_tokens}" for e in chats],
        "follow_up": [chats[1].cached_tokens, chats[1].prompt_tokens],
        "return": [chats[4].cached_tokens, chats[4].prompt_tokens],
    }


@pytest.mark.timeout(5400)
@pytest.mark.parametrize("kind", ["ollama", "openai"])
def test_open_webui_session(
    kind: str, warmstart: Server, venvs: Path, out_dir: Path, tmp_path: Path
) -> None:
    routes = out_dir / f"routes-{kind}.log"
    routes.write_text("")
    recorder, refused = Recorder(log=routes), []
    shots = out_dir / f"open-webui-{kind}"
    shots.mkdir(exist_ok=True)
    with (
        serving(recording_app(warmstart.base_url, recorder)) as proxy,
        open_webui(venvs / "openwebui", tmp_path, kind, proxy) as url,
        browser_page(tmp_path / "profile", url, refused) as page,
    ):
        ui = OpenWebUI(page, url, recorder)
        ui.create_admin()
        try:
            _session(ui, QUESTIONS[kind], shots)
        finally:
            page.screenshot(path=shots / "last.png")
    exchanges = recorder.snapshot()
    summary = _summary(kind, exchanges)
    summary["refused_off_origin"] = sorted(set(refused))
    (out_dir / f"open-webui-{kind}.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    assert not [e for e in exchanges if e.status >= 500], summary["errors"]
    assert all(e.status == 200 for e in exchanges if e.is_user_chat), summary["errors"]
    assert summary["background_before_follow_up"], "Open WebUI sent no background task"
    chats = [e for e in exchanges if e.is_user_chat]
    assert _share(chats[1]) >= CACHED_SHARE, summary
    assert _share(chats[4]) >= CACHED_SHARE, summary
