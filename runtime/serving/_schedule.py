"""The worker's rules (pure): which job goes next, when and how short a prompt's
decodes are kept, which work ends at once for a waiting request, and which user's
request is admitted.

A job's state is one ``Phase`` (as vLLM's ``RequestStatus``). The worker looks at its
jobs through a ``JobView`` (plain data) and tells a job what it decided through the
``Turn`` it gives the job's next step; the job never reads the worker's state.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# a reply being decoded waits about this long for its next token while other requests'
# short prompts are prefilled (a decode step is tens of milliseconds), or for the end of
# the decode in progress when that is longer (a burst of cold prompts: see holds_up)
STALL_S = 0.25
# and a short prompt waits at most this long for its next batch while shorter ones go first
STARVE_S = 5.0
# a prompt with at most this many tokens left before its first token is short (a cache
# hit's new message: about STALL_S of prefill on a 2-core CPU): it goes before replies
SHORT_PROMPT_TOKENS = 64
# a longer one (a cold prompt, seconds of prefill) waits for the replies being decoded
# until it has waited this long since it came, then goes before them
HOLD_S = 3.0
# but for a reply with at most this many tokens left of its max_tokens (a third of a
# second of decode steps on a 2-core CPU): it ends first, unless the prompt has waited
# FINISHING_GRACE_S more. A reply then streams to its end instead of standing still for
# a second in its last tokens (the 4-client trace's median reply: docs/batched-decode.md)
FINISHING_TOKENS = 16
FINISHING_GRACE_S = 1.5
# while a client waits that would go first, or until it has waited that long while
# replies are being decoded, a prompt's decodes hold at most this many tokens (about
# half a second on a 2-core CPU), so a short one is not held up for seconds, nor a
# reply that waited STALL_S
CONTENDED_BATCH_TOKENS = 128
# and a longer batch goes in pieces of about this many (see decode_limits)
CONTENDED_PIECE_TOKENS = 64

_WAITED_ON, _ANSWERED_UNCAPTURED, _ANSWERED = 0, 1, 2


class Phase(enum.Enum):
    """Where a job stands. In the first three its client waits; in the others no
    client does, and the work runs while none waits."""

    WAITING = "waiting"  # queued or admitted; its first step finds out what is cached
    PREFILLING = "prefilling"  # its prompt is computed, before the first token
    DECODING = "decoding"  # its reply is streamed, a token a step
    CAPTURING = "capturing"  # the client has its answer; the prompt's chunks are not kept yet
    SETTLING = "settling"  # they are; the reply is settled into the next turn's batches
    DRAFTING = "drafting"  # a draft (_draft.py): nobody waits for it, nothing to capture first
    DONE = "done"

    @property
    def client_waits(self) -> bool:
        return self in (Phase.WAITING, Phase.PREFILLING, Phase.DECODING)


class EndNow(enum.Enum):
    """Why the worker runs what is left of a job whose client has its answer at once
    (``Worker._end_now``) instead of while no client waits."""

    # requests wait for its sequence: its prompt's chunks are captured, and a reply
    # not settled yet is stored as it was decoded (a settle under way ends its batches)
    FOR_ROOM = "for room"
    # its conversation's next request is here: what is left of settling the reply is
    # that request's own prefill (the same sequence, the same batches), so it is skipped
    FOR_FOLLOWUP = "for follow-up"


@dataclass(frozen=True)
class Turn:
    """What the worker decided for one step of a job (given to ``Job.advance``)."""

    # another client waits that would go first (a hit, a request not looked at yet):
    # the prompt's decodes are short, so that the worker can turn to it sooner
    contended: bool = False
    # the job is ended at once (every step left runs now), and why
    end: EndNow | None = None
    # the next-token logits of the reply token the worker decoded in one batch with
    # other replies' (None: a decode of that token alone left them in the context)
    decoded: np.ndarray | None = None


@dataclass(frozen=True)
class JobView:
    """A job as the rules see it. Times are ``time.monotonic()``."""

    phase: Phase
    to_prefill: int = 0  # the prompt's tokens left to compute before its first token
    stepped_at: float | None = None  # when its last step ended (None: not stepped yet)
    answered_at: float | None = None  # when its client got the answer
    arrived: float = 0.0  # when its request came
    to_decode: int | None = None  # the most tokens its reply has left (None: no reply yet)

    def overdue(self, now: float) -> bool:
        """A long prompt that has waited HOLD_S and FINISHING_GRACE_S since it came."""
        return now - self.arrived >= HOLD_S + FINISHING_GRACE_S

    @property
    def short(self) -> bool:
        """A prompt with SHORT_PROMPT_TOKENS or fewer left before its first token."""
        return self.phase is Phase.PREFILLING and self.to_prefill <= SHORT_PROMPT_TOKENS


# the order of work among waiting clients (rank's second number)
_URGENT, _SHORT, _OVERDUE, _FINISHING, _HELD, _REPLY, _LONG = range(7)


def rank(job: JobView, now: float) -> tuple[int, int, float]:
    """Which work goes first (the least): a client still waiting, then captures, then
    the rest. Among waiting clients: a request's first step (it finds out what is
    cached); short prompts, the fewest tokens left first (a cache hit's new message, a
    cold prompt's last batches: a reply being decoded waits a blink for it); then the
    replies being decoded (they take their next tokens in one step); then long prompts,
    first come first: a cold prompt's seconds of prefill would stop every reply being
    streamed, so it waits for them to end instead, but for at most HOLD_S since it came
    (a small part of its own time to first token), and then goes before them; before a
    reply that ends within FINISHING_TOKENS, only once it has waited FINISHING_GRACE_S
    more (a few steps finish that reply). A reply that waited STALL_S for its next
    token and a short prompt STARVE_S for its next batch go before all of them. Work
    whose client has its answer goes in the order the answers were given: a chat's
    reply is settled before the background requests a front end sends after it (Open
    WebUI's title and tags), so the chat's next turn finds it whole."""
    if not job.phase.client_waits:  # first answered, first kept (a draft: as of now)
        answered = job.answered_at if job.answered_at is not None else now
        uncaptured = job.phase is Phase.CAPTURING
        return _ANSWERED_UNCAPTURED if uncaptured else _ANSWERED, _URGENT, answered
    waited = 0.0 if job.stepped_at is None else now - job.stepped_at
    if job.phase is Phase.DECODING:
        if waited >= STALL_S:
            return _WAITED_ON, _URGENT, 0.0
        ending = job.to_decode is not None and job.to_decode <= FINISHING_TOKENS
        return _WAITED_ON, _FINISHING if ending else _REPLY, 0.0
    if job.phase is Phase.WAITING:
        return _WAITED_ON, _URGENT, 0.0
    if job.short:
        return _WAITED_ON, _URGENT if waited >= STARVE_S else _SHORT, float(job.to_prefill)
    if job.overdue(now):
        return _WAITED_ON, _OVERDUE, job.arrived
    return _WAITED_ON, _HELD if now - job.arrived >= HOLD_S else _LONG, job.arrived


def holds_up(job: JobView, others: Iterable[JobView], queued: bool, now: float) -> bool:
    """Whether a long decode of ``job``'s prompt would hold up another client: a request
    is ``queued``, or one of ``others`` is admitted and not looked at yet (either may be
    a hit), or is a short prompt with fewer tokens left (it goes first as soon as the
    worker turns: a hit is not held up by another's cold prefill); or a reply is being
    decoded and ``job`` is not overdue (a hit that comes then is not held up by a whole
    batch either, and the reply gets its next token after STALL_S). Then ``job``
    prefills in short decodes and pieces (``Turn.contended``). Long prompts wait for the
    one that came first, and an overdue one goes in whole batches, a reply getting its
    next token between two decodes: a burst of cold prompts is prefilled in whole
    merged batches, as fast as alone."""
    return queued or any(
        other.phase is Phase.WAITING
        or (other.short and other.to_prefill < job.to_prefill)
        or (other.phase is Phase.DECODING and not job.overdue(now))
        for other in others
    )


def decode_limits(most: int, contended: bool) -> tuple[int, int]:
    """The most tokens one decode of a prompt may hold (``most``: the tuning's merge
    limit), and the pieces a batch of the long kind goes in (0: whole; see
    ``kvstore.piece_end``): fewer and shorter while ``contended`` (``holds_up``)."""
    if not contended:
        return most, 0
    return min(most, CONTENDED_BATCH_TOKENS), CONTENDED_PIECE_TOKENS


def ended_for_room(jobs: Sequence[JobView], short: int) -> list[int]:
    """Which of ``jobs`` (by index) end at once (``EndNow.FOR_ROOM``) when ``short``
    more sequences are wanted than are free: work whose client has its answer, those
    whose prompt's chunks are captured first (what is left of them is least), so that
    a waiting request takes its sequence instead of waiting behind work that only runs
    while no client waits."""
    answered = [i for i, j in enumerate(jobs) if not j.phase.client_waits]
    answered.sort(key=lambda i: jobs[i].phase is Phase.CAPTURING)
    return answered[: max(short, 0)]


def overdue(jobs: Sequence[JobView], now: float, after_s: float) -> list[int]:
    """Which of ``jobs`` (by index) got their answer ``after_s`` ago or more and have not
    captured their prompt's chunks yet."""
    return [
        i
        for i, j in enumerate(jobs)
        if j.phase is Phase.CAPTURING
        and j.answered_at is not None
        and now - j.answered_at >= after_s
    ]


def next_admission(
    owners: Sequence[str], answering: Mapping[str, int], admitted_at: Mapping[str, int]
) -> int:
    """Which waiting request (by index, ``owners`` in arrival order) is admitted next:
    users in turn (the owner with the fewest requests being answered, then the one
    admitted longest ago, by ``admitted_at``'s numbers), each user's requests in
    arrival order. One user's burst (an agent loop) then waits behind itself, not in
    front of everyone else; with one user it is the queue's order."""

    def turn(i: int) -> tuple[int, int, int]:
        return answering.get(owners[i], 0), admitted_at.get(owners[i], -1), i

    return min(range(len(owners)), key=turn)
