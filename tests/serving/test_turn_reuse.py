"""Whole-history resends reuse the whole history (issue 18, item 3), exactly.

Prefill batches end where each message starts, and a prefill steps through each reply
a token at a time, as it was decoded; so a later turn's prompt, which holds the earlier
messages at the same places, computes the same batches up to its new message, and the
decoded reply is already what it computes. Each turn of a chat and each step of a tool
loop then prefills only what is new, and greedy replies still equal ``--no-cache``,
including when a step is sent the moment the previous reply ends.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import replace

import pytest
from warmstart.runtime.types import Done, Message, Request, Sampling, Tool

from tests.conftest import SYSTEM, wait_for
from tests.serving.conftest import answer

pytestmark = pytest.mark.slow

WEATHER = Tool(
    "get_weather",
    "The current weather in a city.",
    json.dumps(
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ),
)


def _reply(rt, request: Request, wait: bool = True) -> tuple[Message, int]:  # type: ignore[no-untyped-def]
    """The reply as the next turn's message, and the prompt tokens that were cached."""
    message, done = answer(rt, request, wait)
    return message, sum(done.report.restored.values())


def _history_tokens(rt, messages: tuple[Message, ...], request: Request) -> int:  # type: ignore[no-untyped-def]
    """Where the next message starts: the history as the next prompt renders it."""
    ids, _ = rt.prompter.prompt_ids(replace(request, messages=messages), generation=False)
    return len(ids)


def _chat(messages: tuple[Message, ...], max_tokens: int = 12, **more: object) -> Request:
    return Request(messages=messages, sampling=Sampling(max_tokens=max_tokens), **more)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("step_replies", "flash_attn"),
    [(True, "auto"), (False, "auto"), (True, "off")],
    ids=["stepped", "re-prefilled", "stepped-no-flash-attention"],
)
def test_each_turn_of_a_chat_reuses_everything_before_its_new_message(
    make_runtime, tmp_path, step_replies, flash_attn
) -> None:  # type: ignore[no-untyped-def]
    """Either way a reply gets into the next turn's batches: stepped through as it was
    decoded (the default on a CPU), or re-prefilled in batches after it is sent (the
    default where layers are offloaded to a GPU). Without flash attention too
    (llama.cpp then stores V transposed: a chunk is a slice of every V dimension)."""
    more = {"step_replies": step_replies, "flash_attn": flash_attn}
    rt = make_runtime(tmp_path / "cached", **more)
    oracle = make_runtime(tmp_path / "oracle", no_cache=True, **more)
    messages: tuple[Message, ...] = (SYSTEM, Message("user", "Name a colour."))
    for follow in ("Another one?", "And a third?", None):
        request = _chat(messages)
        reply, cached = _reply(rt, request)
        expected, _ = _reply(oracle, request)
        assert reply.content == expected.content
        if len(messages) > 2:  # every turn after the first
            assert cached == _history_tokens(rt, messages[:-1], request), cached
        if follow is None:
            break
        messages = (*messages, reply, Message("user", follow))


def test_a_turn_sent_at_once_reuses_the_reply_as_it_was_decoded(make_runtime, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A prefill steps through a reply a token at a time, as it was decoded, so the
    decoded KV is the next turn's own: sent the moment the reply ends, turn 2 finds the
    reply live and prefills only its end-of-turn markup and the new message (llama-
    server reuses the decoded reply too, without the guarantee), and its reply still
    equals ``--no-cache``."""
    rt = make_runtime(tmp_path / "cached", step_replies=True)
    oracle = make_runtime(tmp_path / "oracle", no_cache=True, step_replies=True)
    messages: tuple[Message, ...] = (SYSTEM, Message("user", "Name a colour."))
    first = _chat(messages, 24)
    reply, _ = _reply(rt, first, wait=False)
    second = _chat((*messages, reply, Message("user", "Another one?")), 24)
    again, cached = _reply(rt, second, wait=False)
    assert again.content == _reply(oracle, second)[0].content
    # all of the history but the reply's end-of-turn markup (and its last token, when
    # max_tokens cut it: sampled, never decoded)
    history = _history_tokens(rt, second.messages[:-1], second)
    assert cached >= history - 3, (cached, history)


def _said(message: Message) -> tuple[str, list[tuple[str, str]]]:
    """What a reply says (call ids are fresh random names)."""
    return message.content, [(c.name, c.arguments) for c in message.tool_calls]


def _tool_loop(rt, wait: bool) -> list[tuple[Request, Message, int]]:  # type: ignore[no-untyped-def]
    """Three steps of an agent loop: each is the whole history plus a tool result."""
    steps = []
    messages: tuple[Message, ...] = (SYSTEM, Message("user", "What is the weather in Oslo?"))
    for _ in range(3):
        request = _chat(messages, 64, tools=(WEATHER,), tool_choice="required")
        reply, cached = _reply(rt, request, wait=wait)
        steps.append((request, reply, cached))
        calls = reply.tool_calls
        assert calls, reply
        result = json.dumps({"city": json.loads(calls[0].arguments).get("city"), "sky": "grey"})
        tool = Message("tool", result, tool_call_id=calls[0].id, name=calls[0].name)
        messages = (*messages, reply, tool)
    return steps


def test_a_tool_loop_sent_at_once_equals_no_cache_and_reuses_when_idle(
    make_runtime, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Sent the moment the previous reply ends, a step takes what is left of settling
    the reply (a tool call is rendered otherwise than it was sampled) into its own
    prefill; sent once the runtime is idle, it finds everything before its new
    message. Either way its reply equals ``--no-cache``."""
    rt = make_runtime(tmp_path / "cached")
    at_once = _tool_loop(rt, wait=False)
    rt.wait_idle()
    assert rt.counters["preempted"] >= 1  # a step did find its previous reply's work pending
    rt.evict_live()
    idle = _tool_loop(make_runtime(tmp_path / "idle"), wait=True)
    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    for steps in (at_once, idle):
        for request, reply, _ in steps:
            expected, _ = _reply(oracle, request)
            assert _said(reply) == _said(expected)
    for i, (request, _, cached) in enumerate(idle[1:], start=1):
        assert cached == _history_tokens(rt, request.messages[:-1], request), (i, cached)


def test_a_repeat_after_the_reply_was_kept_decodes_nothing_before_its_reply(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path
) -> None:
    """Keeping the reply for the next turn keeps the prompt's own last batches too (the
    assistant's opening ends batches in every prompt), and the sequence keeps the
    logits its prompt ended with: a repeat is a live hit of the whole prompt, and its
    first token is drawn from those logits, as the cold run drew it."""
    rt = make_runtime(tmp_path / "cached")
    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    request = _chat((SYSTEM, Message("user", "Name a colour.")))
    first, _ = _reply(rt, request)
    again, cached = _reply(rt, request)
    assert again == first == _reply(oracle, request)[0]
    ids, _ = rt.prompter.prompt_ids(request)
    assert cached == len(ids), cached


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(max_tokens=8, temperature=0.9, top_k=40, top_p=0.9, seed=7),
        Sampling(max_tokens=6, logprobs=3),
        Sampling(max_tokens=8, grammar='root ::= "{" [a-z]+ ":" [0-9]+ "}"'),
    ],
    ids=["seeded", "logprobs", "grammar"],
)
def test_a_repeat_drawn_from_the_kept_logits_equals_the_cold_reply(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path, sampling
) -> None:
    """The first token of a whole-prompt live hit comes from the logits the sequence
    kept, through the same sampler chain llama.cpp applies to a decode's logits:
    seeded draws, log-probabilities and grammars give what a cold run gives."""
    rt = make_runtime(tmp_path / "cached")
    oracle = make_runtime(tmp_path / "oracle", no_cache=True)
    request = Request(messages=(SYSTEM, Message("user", "Name a colour.")), sampling=sampling)
    ids, _ = rt.prompter.prompt_ids(request)

    def events(runtime) -> tuple[list[object], object]:  # type: ignore[no-untyped-def]
        out = list(runtime.generate(request))
        runtime.wait_idle()
        done = out[-1]
        assert isinstance(done, Done)
        return [(e.text, e.logprobs) for e in out[:-1]], done.report  # type: ignore[union-attr]

    cold, _ = events(oracle)
    first, _ = events(rt)
    again, report = events(rt)
    assert sum(report.restored.values()) == len(ids) and report.restored["live"] == len(ids)
    assert again == first == cold


@pytest.mark.parametrize("markup", ["chatml", "llama-3"])
def test_a_reply_cut_by_max_tokens_and_hurried_is_reused_to_its_end(
    make_runtime, tmp_path, monkeypatch, markup
) -> None:  # type: ignore[no-untyped-def]
    """Another request took the sequence the moment a reply ended (the worker's
    _make_room: its settling is cut short, the reply stored as decoded). A reply that
    max_tokens cut ends with a token sampled but never decoded: it is decoded then, so
    the reply's chunk is the one the next turn's prompt steps through, and turn 2,
    restored from the store, reuses the whole reply, and still equals ``--no-cache``.
    With Llama 3's markup (a synthetic model's) the next turn opens right after the
    end-of-turn token, which is then a one-token batch of the reply's run too: it is
    decoded as well (the 1B-shaped trace restored only up to each reply's start)."""
    from warmstart.runtime.models import synthetic_model
    from warmstart.runtime.serving._factory import build_runtime
    from warmstart.runtime.serving._pipeline import Job
    from warmstart.runtime.serving._schedule import EndNow, Turn

    from tests.conftest import small_settings

    if markup == "llama-3":
        model = synthetic_model("tiny", tmp_path)

        def make_runtime(data_dir, **overrides):  # type: ignore[no-untyped-def]
            settings = small_settings(data_dir, model, extra_buffers="off", **overrides)
            return opened.enter_context(build_runtime(settings))

    settle = Job._settle

    def hurried(self, res):  # type: ignore[no-untyped-def]
        self.turn = Turn(end=EndNow.FOR_ROOM)  # as _make_room's end leaves it
        return (yield from settle(self, res))

    monkeypatch.setattr(Job, "_settle", hurried)
    with contextlib.ExitStack() as opened:
        rt = make_runtime(tmp_path / "cached", step_replies=True)
        oracle = make_runtime(tmp_path / "oracle", no_cache=True, step_replies=True)
        messages: tuple[Message, ...] = (SYSTEM, Message("user", "Tell me about the sea."))
        first = _chat(messages, 6)
        reply, _ = _reply(rt, first)
        rt.evict_live()  # the sequence went to another conversation
        second = _chat((*messages, reply, Message("user", "And rivers?")), 6)
        again, cached = _reply(rt, second)
        assert again.content == _reply(oracle, second)[0].content
        history = _history_tokens(rt, second.messages[:-1], second)
        prompt = len(rt.prompter.prompt_ids(first)[0])
    # ChatML: all but the reply's end-of-turn markup (2 tokens); Llama 3: all of it
    assert cached >= (history - 1 if markup == "llama-3" else history - 3)
    assert cached >= prompt + 5


@pytest.mark.parametrize("step_replies", [True, False], ids=["stepped", "re-prefilled"])
@pytest.mark.parametrize("interrupted", [False, True], ids=["at-once", "settle-interrupted"])
def test_a_repeat_of_the_request_just_answered_decodes_nothing(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path, step_replies: bool, interrupted: bool
) -> None:
    """Sent the moment the reply ends, the same request again is a live hit of its whole
    prompt and decodes nothing of it (counted, not timed: at 1B a decode of the
    prompt's last two tokens is 0.2 s), also when another chat's request stopped the
    decode that settles the reply (the settle is redone after it, and keeps the
    prompt's own last batches and logits)."""
    rt = make_runtime(tmp_path / "cached", step_replies=step_replies)
    request = _chat((SYSTEM, Message("user", "Name a colour.")))
    other = _chat((Message("system", "You are terse."), Message("user", "Count to five.")))
    n_ids = len(rt.prompter.prompt_ids(request)[0])
    decodes: list[tuple[int, int]] = []  # (sequence, where the decode ends) of every decode
    others: list[Message] = []
    prefill = rt.engine.prefill

    def counted(res, tokens, want_logits, ends=None):  # type: ignore[no-untyped-def]
        settling = not want_logits and len(res.tokens) >= n_ids  # the reply is in
        if interrupted and settling and not others:  # its settle's first decode
            others.append(Message("assistant", ""))
            threading.Thread(target=lambda: others.append(_reply(rt, other, False)[0])).start()
            assert wait_for(lambda: bool(rt.worker.waiting), 30)  # its enqueue stops this
        decodes.append((res.seq, len(res.tokens) + len(tokens)))
        return prefill(res, tokens, want_logits, ends)

    rt.engine.prefill = counted
    first, _ = _reply(rt, request, wait=False)
    seq = next(s for s, end in decodes if end == n_ids)  # where its prompt's last batch went
    if interrupted:
        assert wait_for(lambda: len(others) == 2, 120) and rt.engine.interruptions > 0
    before = len(decodes)
    *tokens, done = rt.generate(request)
    rt.wait_idle()
    # its sequence decoded only its reply's tokens (each past the prompt's end)
    assert all(end > n_ids for s, end in decodes[before:] if s == seq), decodes[before:]
    assert isinstance(done, Done) and done.report.restored["live"] == n_ids, done.report
    assert "".join(t.text for t in tokens) == first.content  # type: ignore[union-attr]


def test_another_short_question_is_one_decode_and_equals_no_cache(  # type: ignore[no-untyped-def]
    make_runtime, tmp_path
) -> None:
    """With warmstart's batch tile (8), another short question after the same system
    prompt continues the live sequence and prefills its text and the assistant's
    opening in one decode (the opening's tail rides in the question's batch:
    kvstore/_batches.py), counted, not timed; a live repeat decodes nothing; its next
    turn prefills the user's turn markup, then the question with its tail. A repeat
    restored from RAM decodes nothing either (the store kept that batch with its
    logits). Every reply equals ``--no-cache``."""
    same = dict(batch_tile=8, merge_batch_tokens=512)
    rt = make_runtime(tmp_path / "cached", **same)
    oracle = make_runtime(tmp_path / "oracle", no_cache=True, **same)
    system = Message("system", SYSTEM.content + " You know the staff handbook well." * 6)
    _reply(rt, _chat((system, Message("user", "Name a colour."))))
    decodes: list[int] = []  # the tokens of each prefill decode, the prompt's last < 0
    starts: list[int] = []  # where each begins
    prefill = rt.engine.prefill

    def counted(res, tokens, want_logits, ends=None):  # type: ignore[no-untyped-def]
        decodes.append(-len(tokens) if want_logits else len(tokens))
        starts.append(len(res.tokens))
        return prefill(res, tokens, want_logits, ends)

    def prompt_decodes(request: Request) -> tuple[Message, list[int], Done]:
        decodes.clear()
        message, done = answer(rt, request, wait=True)
        assert message.content == answer(oracle, request)[0].content
        return message, decodes[: 1 + next(i for i, n in enumerate(decodes) if n < 0)], done

    rt.engine.prefill = counted
    other = _chat((system, Message("user", "Name a fruit.")))
    reply, calls, done = prompt_decodes(other)
    ids, anchors = rt.prompter.prompt_ids(other)
    text = max(a for a in anchors if a < len(ids) - 2)  # where the question starts
    assert done.report.restored["live"] == text and done.report.restored["ram"] == 0
    assert calls == [text - len(ids)], calls  # one decode: the question and its tail
    starts.clear()  # the same again: a live hit of the whole prompt, which decodes nothing
    again, done = answer(rt, other, wait=True)
    assert again.content == reply.content and done.report.restored["live"] == len(ids)
    assert min(starts, default=len(ids)) >= len(ids), starts  # (its reply's tokens only)
    nxt = _chat((*other.messages, reply, Message("user", "And a vegetable?")))
    _, calls, done = prompt_decodes(nxt)
    assert len(calls) == 2 and 0 < calls[0] < 8 <= -calls[1] <= 16, calls
    rt.evict_live()  # restored from RAM with the logits its last batch gave: no decode
    starts.clear()
    again, done = answer(rt, other, wait=True)
    assert again.content == reply.content and done.report.restored["ram"] == len(ids)
    assert min(starts, default=len(ids)) >= len(ids), starts
