"""The commands that load a model (ask, chat, serve, bench, doctor), and the one that
opens the desktop app. Output here is the CLI's own: print is allowed."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

from ..settings import Settings
from ._flags import settings_from
from ._running import Running, introduction, remove_note, write_note

if TYPE_CHECKING:
    from ..serving import LocalRuntime

log = logging.getLogger("warmstart")


def _open_runtime(
    settings: Settings, prewarm: bool = True, calibrate_later: bool = False
) -> LocalRuntime:
    from ..serving import open_runtime

    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    return open_runtime(settings, progress=say, prewarm=prewarm, calibrate_later=calibrate_later)


def _print_reply(stream: Any) -> Any:
    """Prints the reply as it comes. Ctrl-C stops the generation (the runtime sees the
    cancel at its next token) and keeps the turn with the text shown so far."""
    from ..types import Done, Token

    report = None
    try:
        for event in stream:
            if isinstance(event, Token):
                print(event.text, end="", flush=True)
            elif isinstance(event, Done):
                report = event.report
    except KeyboardInterrupt:
        stream.cancel()
        # the rest is read, not shown: what was decoded after the key press is dropped
        report = next((e.report for e in stream if isinstance(e, Done)), None)
        print("\n[interrupted]", file=sys.stderr)
        return report
    print()
    if report is not None:
        print(f"[{report.summary()}]", file=sys.stderr)
    return report


def _check_session_flag(args: argparse.Namespace) -> None:
    """A --session that cannot name a session is refused before the model loads (the
    runtime would refuse it after): ``warmstart sessions`` still reads and deletes
    one stored under such an id by an older version."""
    from ..serving import check_session_id

    if args.session is not None:
        check_session_id(args.session, "--session")


def cmd_ask(args: argparse.Namespace) -> int:
    from ..serving import derived_session_id
    from ..types import Message, Request, Sampling

    settings = settings_from(args)
    _check_session_flag(args)
    messages: list[Message] = [Message("system", args.system)] if args.system else []
    # one question: it fetches what it needs itself; warming other conversations
    # would only compete with it for the disk (and a restore that races the promotion
    # of the same chunks to RAM fails today: "chunk size does not match its cell count")
    with _open_runtime(settings, prewarm=False) as rt:
        if args.session:
            info = rt.session(args.session)
            if info is not None:
                messages = list(info.messages)
        messages.append(Message("user", args.question))
        sampling = Sampling(
            temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed
        )
        report = _print_reply(
            rt.generate(
                Request(
                    messages=tuple(messages),
                    sampling=sampling,
                    # the user's own question: listed as a conversation of theirs,
                    # unlike an API request that names none (kept out of the list)
                    session_id=args.session or derived_session_id(tuple(messages)),
                    use_cache=not settings.no_cache,
                )
            )
        )
    return 130 if report is not None and report.finish_reason == "cancelled" else 0


def cmd_chat(args: argparse.Namespace) -> int:
    from ._chat import ChatLoop
    from ._lines import TurnReader, waiting_on

    settings = settings_from(args)
    _check_session_flag(args)
    read = TurnReader()  # a line is a turn; a """ block is one too
    if sys.stdin.isatty():
        # input() gains line editing and this session's history (kept in memory only:
        # the conversation text stays in sessions.db, where `history` governs it)
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401
        # readline reads the terminal a byte at a time: the rest of a pasted block is
        # still waiting on stdin when the first line comes back, and joins its turn
        read = TurnReader(more=waiting_on(sys.stdin.fileno()))
    with _open_runtime(settings) as rt:
        return ChatLoop(
            rt,
            args.session,
            args.system,
            args.max_tokens,
            args.temperature,
            print_reply=_print_reply,
            read=read,
            seed=args.seed,
        ).run()


def cmd_serve(args: argparse.Namespace) -> int:
    from ..api import bind_listener, bind_unix, serve
    from ..serving import model_opener

    settings = settings_from(args)
    sock = bind_listener(settings)  # a port in use is reported now, not after the load
    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    running = Running(
        pid=os.getpid(),
        host=settings.host,
        port=int(sock.getsockname()[1]),  # the one bound, when --port 0 asked for any
        scheme="https" if settings.tls_cert else "http",
        key_required=bool(settings.api_key),
    )

    def ready(model: str) -> None:
        print(introduction(settings, running, model), file=sys.stderr, flush=True)
        try:
            write_note(settings.data_dir, running)
        except OSError as exc:  # the server serves anyway; the CLI then needs --port
            log.warning("cannot write the server note in %s: %s", settings.data_dir, exc)

    try:
        unix = bind_unix(settings.unix_socket)
        try:
            # a server answers at once on a fresh data dir (a 1B model calibrated for
            # 35 s before its first request, an 8B one takes minutes on a CPU)
            with _open_runtime(settings, calibrate_later=not settings.calibrate_first) as rt:
                opener = model_opener(settings, say)
                serve(settings, rt, sock=sock, opener=opener, unix=unix, on_ready=ready)
        finally:
            if unix is not None:
                unix.close()
    finally:
        sock.close()
        remove_note(settings.data_dir, running.pid)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench import run_bench

    if args.paste:
        from ..bench import render_paste, run_paste

        result = run_paste(settings_from(args), args.paste, args.type_seconds)
        print(json.dumps(result, indent=2) if args.json else render_paste(result))
        return 0
    if args.replies:
        from ..bench import render_replies, run_replies

        tokens = args.reply_tokens or (16 if args.quick else 64)
        rounds = args.rounds or (1 if args.quick else 3)
        result = run_replies(settings_from(args), args.replies, tokens, rounds)
        print(json.dumps(result, indent=2) if args.json else render_replies(result))
        return 0

    return run_bench(
        settings_from(args),
        as_json=args.json,
        quick=args.quick,
        system_tokens=args.system_tokens,
        conversations=args.conversations,
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from ._doctor import doctor

    return doctor(settings_from(args), as_json=args.json)


def cmd_app(args: argparse.Namespace) -> int:
    return run_app(list(args.app_args))


def run_app(app_args: list[str]) -> int:
    if importlib.util.find_spec("PySide6") is None:
        print(
            "warmstart: the desktop app needs PySide6, which this installation lacks; "
            # this interpreter's pip: the shell's own pip installs into another Python
            f"install it with: {shlex.quote(sys.executable)} -m pip install 'warmstart[app]'",
            file=sys.stderr,
        )
        return 2
    # the app is a sibling package (warmstart.app), a client of the HTTP API only
    app = importlib.import_module(str(__package__).rsplit(".", 2)[0] + ".app")
    return int(app.main(app_args[1:] if app_args[:1] == ["--"] else app_args) or 0)
