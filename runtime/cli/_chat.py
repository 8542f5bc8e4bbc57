"""The interactive `warmstart chat` loop (CLI output; print is allowed)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..serving import new_session_id
from ..types import Event, Message, Request, Sampling, SessionInfo, Token

HELP = (
    "/new starts a conversation, /list lists them, /resume ID continues one, /quit leaves; "
    'a pasted block is one message, and so are the lines between two """'
)


class ChatLoop:
    def __init__(
        self,
        rt: Any,
        session_id: str | None,
        system: str,
        max_tokens: int,
        temperature: float,
        print_reply: Callable[[Any], Any],
        read: Callable[[str], str] = input,
        seed: int | None = None,
    ) -> None:
        self.rt, self.system = rt, system
        self.sampling = Sampling(temperature=temperature, max_tokens=max_tokens, seed=seed)
        self.print_reply, self.read = print_reply, read
        self.session_id = session_id or new_session_id()
        self.messages: list[Message] = []
        if session_id:  # exactly that one (as for ask): a new id names a new one
            info = rt.session(session_id)
            if info is None:
                print(f"no conversation {session_id}; starting it", file=sys.stderr)
            else:
                self._resume(info)

    def _find(self, wanted: str) -> tuple[SessionInfo | None, list[str]]:
        """The conversation whose id is ``wanted`` or uniquely starts with it, else
        (None, the ids that start with it: none, or several)."""
        info = self.rt.session(wanted)
        if info is not None:
            return info, [info.id]
        # anonymous ones too: their ids are only ever typed from `sessions list --all`
        ids = [s.id for s in self.rt.sessions(anonymous=True) if s.id.startswith(wanted)]
        found = self.rt.session(ids[0]) if len(ids) == 1 else None
        return found, ids

    def _resume(self, info: SessionInfo) -> None:
        self.session_id, self.messages = info.id, list(info.messages)
        print(
            f"resumed {info.id}: {info.title} ({len(self.messages)} messages, "
            f"cached: {info.location})",
            file=sys.stderr,
        )

    def run(self) -> int:
        print(f"conversation {self.session_id} ({HELP})", file=sys.stderr)
        while True:
            try:
                line = self.read("> ").strip()
            except EOFError:
                return 0
            except KeyboardInterrupt:  # Ctrl-C at the prompt (a second one): leave
                print(file=sys.stderr)
                return 130
            if not line:
                continue
            if line.startswith("/") and self._command(line):
                return 0
            if not line.startswith("/"):
                self._turn(line)

    def _command(self, line: str) -> bool:
        cmd, _, arg = line.partition(" ")
        if cmd == "/quit":
            return True
        if cmd == "/new":
            self.session_id, self.messages = new_session_id(), []
            print(f"conversation {self.session_id}", file=sys.stderr)
        elif cmd == "/list":
            for s in self.rt.sessions():
                print(f"{s.id}  {s.location:5s} {s.n_tokens:6d} tok  {s.title}")
        elif cmd == "/resume" and arg:
            info, ids = self._find(arg.strip())
            if info is None:  # an error: the conversation under way goes on
                problem = _not_found(arg.strip(), ids)
                print(f"{problem}; still in {self.session_id} (/list)", file=sys.stderr)
            else:
                self._resume(info)
        else:
            print(HELP, file=sys.stderr)
        return False

    def _turn(self, text: str) -> None:
        if not self.messages and self.system:
            self.messages.append(Message("system", self.system))
        self.messages.append(Message("user", text))
        request = Request(
            messages=tuple(self.messages), sampling=self.sampling, session_id=self.session_id
        )
        stream = _Tee(self.rt.generate(request))
        report = self.print_reply(stream)
        cut = report is not None and report.finish_reason == "cancelled"
        # Ctrl-C: the turn keeps what was shown, and the prompt comes back
        self.messages.append(Message("assistant", stream.shown(), interrupted=cut))


def _not_found(wanted: str, ids: list[str]) -> str:
    if not ids:
        return f"no conversation {wanted}"
    shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
    return f"{wanted!r} starts the ids of {len(ids)} conversations ({shown}); type more of one"


class _Tee:
    """A stream that remembers the text its reader took before cancelling it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._taken: list[str] = []
        self._cancelled = False

    def __iter__(self) -> Iterator[Event]:
        for event in self._stream:
            if isinstance(event, Token) and not self._cancelled:
                self._taken.append(event.text)
            yield event

    def cancel(self) -> None:
        self._cancelled = True
        self._stream.cancel()

    def shown(self) -> str:
        return "".join(self._taken)
