"""The ``warmstart`` command line. Output here is the CLI's own: print is allowed."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._private import restrict_umask
from ..errors import WarmstartError
from ..settings import Settings, load_settings
from ._flags import BRIEF, add_settings_flags
from ._running import Running, introduction, remove_note, write_note

if TYPE_CHECKING:
    from ..serving import LocalRuntime

log = logging.getLogger("warmstart")

_DEFAULT_SYSTEM = "You are a helpful, concise assistant."


def settings_from(args: argparse.Namespace) -> Settings:
    return load_settings(**{n: getattr(args, n, None) for n in Settings.model_fields})


# commands ------------------------------------------------------------------------------------
def _open_runtime(settings: Settings, prewarm: bool = True) -> LocalRuntime:
    from ..serving import open_runtime

    say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    return open_runtime(settings, progress=say, prewarm=prewarm)


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


def cmd_sessions(args: argparse.Namespace) -> int:
    """Through the running server when one answers (it owns the store), else on the
    files: either way no model is loaded."""
    from ._remote import Server

    settings = settings_from(args)
    server = Server.find(settings, use_note=args.port is None)
    if server is None:
        return _sessions_offline(settings, args)
    try:
        if args.action == "list":
            for s in server.sessions(anonymous=args.all):
                mark = "  (no session id)" if s.get("anonymous") else ""
                print(f"{s['id']}  {s['n_tokens']:6d} tok  {s['title']}{mark}")
            return 0
        if args.action == "show":
            found = server.session(args.id)
            if found is None:
                print(f"warmstart: no session {args.id}", file=sys.stderr)
                return 1
            for m in found["messages"]:
                mark = " [interrupted]" if m.get("interrupted") else ""
                print(f"{m['role']}: {m['content']}{mark}\n")
            return 0
        ok = server.delete_session(args.id)
        print("deleted" if ok else f"no session {args.id}")
        return 0 if ok else 1
    finally:
        server.close()


def _sessions_offline(settings: Settings, args: argparse.Namespace) -> int:
    from ..serving import SessionBook
    from . import _offline as offline

    book = SessionBook(settings.data_dir / "sessions.db")
    try:
        if args.action == "list":
            for row in book.list(anonymous=args.all):
                mark = "  (no session id)" if row.anonymous else ""
                print(f"{row.id}  {row.n_tokens:6d} tok  {row.title}{mark}")
        elif args.action == "show":
            found = book.get(args.id)
            if found is None:
                print(f"warmstart: no session {args.id}", file=sys.stderr)
                return 1
            for m in found.messages:
                print(f"{m.role}: {m.content}" + (" [interrupted]" if m.interrupted else ""))
                print()
        else:
            ok = offline.delete_session(settings.effective_cache_dir, book, args.id)
            print("deleted" if ok else f"no session {args.id}")
            return 0 if ok else 1
    finally:
        book.close()
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    """Through the running server when one answers (its own counters; clearing what
    it holds), else on the files without loading a model."""
    from ..serving import SessionBook
    from . import _offline as offline
    from ._remote import Server

    settings = settings_from(args)
    server = Server.find(settings, use_note=args.port is None)
    if server is not None:
        try:
            if args.action == "clear":
                server.clear_cache()
                print(f"cache cleared (by the server at {server.url})")
            else:
                _print_stats(args, server.stats(), f"the server at {server.url}")
        finally:
            server.close()
        return 0
    if args.action == "clear":
        _clear_cache_dir(settings.effective_cache_dir)
        print("cache cleared")
        return 0
    book = SessionBook(settings.data_dir / "sessions.db")
    try:
        stats = offline.cache_stats(settings.effective_cache_dir, book)
    finally:
        book.close()
    where = f"the files in {settings.effective_cache_dir}: no server answered"
    _print_stats(args, stats, where)
    return 0


def _print_stats(args: argparse.Namespace, stats: dict[str, Any], origin: str) -> None:
    from ._stats_text import render_stats

    print(json.dumps(stats, indent=2) if args.json else render_stats(stats, origin))


def _clear_cache_dir(cache_dir: Path) -> None:
    """Deletes the cache's files whatever state they are in (a damaged index too) and
    loads no model; sessions and calibration live elsewhere and stay."""
    from .._private import private_dir
    from ..errors import DiskUnavailable
    from ..kvstore import reset_directory

    if not cache_dir.exists():
        return
    private_dir(cache_dir, "cache_dir")  # never empty a directory that is not ours
    try:
        reset_directory(cache_dir)
    except OSError as exc:
        raise DiskUnavailable(f"cannot clear the cache in {cache_dir}: {exc}") from exc


def cmd_models(args: argparse.Namespace) -> int:
    from ..models import ModelManager

    settings = settings_from(args)
    mm = ModelManager(settings.models_dir)
    if args.action == "pull":
        print(mm.pull(args.name))
    elif args.action == "rm":
        for path in mm.rm(args.name):
            print(f"removed {path}")
    elif args.available:
        _print_available(settings, {str(m["name"]) for m in mm.list()})
    else:
        for m in mm.list():
            print(f"{m['name']:24s} {m['bytes']:>12,d}  {m['path']}")
    return 0


def _print_available(settings: Settings, installed: set[str]) -> None:
    from ..hardware import probe
    from ..models import available_rows, load_catalogue, with_default

    profile = probe(settings.effective_cache_dir)
    for row in available_rows(with_default(load_catalogue()), profile, installed):
        print(row)


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
            with _open_runtime(settings) as rt:
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


# the parser ----------------------------------------------------------------------------------
def _version() -> str:
    try:
        return importlib.metadata.version("warmstart")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def _needs_id(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.action in ("show", "delete") and not args.id:
        parser.error(f"sessions {args.action}: give the conversation's id")


def build_parser(show_all: bool = False) -> argparse.ArgumentParser:
    """``show_all``: ask's and chat's --help list every setting they accept (what
    --help-all asks for), not only the everyday ones."""
    parser = argparse.ArgumentParser(
        prog="warmstart",
        description=("A local assistant that never prefills the same prefix twice."),
    )
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.add_argument("--version", action="version", version=f"warmstart {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(
        name: str,
        fn: Callable[[argparse.Namespace], int],
        help: str,
        settings: bool = True,
        first: Callable[[argparse.ArgumentParser], None] | None = None,
    ) -> argparse.ArgumentParser:
        """``first`` adds the command's own options, shown before the settings."""
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(fn=fn)
        if first is not None:
            first(p)
        if settings:
            hidden = add_settings_flags(p, name, show_all)
            if name in BRIEF:
                p.add_argument("--help-all", action="help", help="show every setting it takes")
            if hidden:
                p.epilog = (
                    f"{hidden} more settings (the context, threads, the KV cache's "
                    f"tunables): warmstart {name} --help-all"
                )
        return p

    def sampling_flags(p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group("the conversation and sampling")
        g.add_argument(
            "--system", default=_DEFAULT_SYSTEM, help="system prompt (default: %(default)r)"
        )
        g.add_argument(
            "--session", default=None, help="conversation id to continue (default: a new one)"
        )
        g.add_argument(
            "--max-tokens",
            type=int,
            default=256,
            help="longest reply, in tokens (default: %(default)s; at least 1)",
        )
        g.add_argument(
            "--temperature",
            type=float,
            default=0.0,
            help="0 <= value <= 2; 0 is greedy (default: %(default)s)",
        )
        g.add_argument("--seed", type=int, default=None, help="sampling seed (default: random)")

    p = command(
        "ask",
        cmd_ask,
        "ask one question and print the reply and where its prompt came from",
        first=sampling_flags,
    )
    p.add_argument("question")
    command("chat", cmd_chat, "chat interactively; conversations persist", first=sampling_flags)
    p = command("sessions", cmd_sessions, "list, show or delete conversations")
    p.add_argument("action", choices=["list", "show", "delete"])
    p.add_argument("id", nargs="?", help="the conversation (show and delete)")
    p.add_argument(
        "--all",
        action="store_true",
        help="list: also the conversations of API requests that named no session",
    )
    p.set_defaults(check=lambda args, p=p: _needs_id(p, args))
    p = command("cache", cmd_cache, "show KV cache statistics or clear the cache")
    p.add_argument("action", choices=["stats", "clear"])
    p.add_argument("--json", action="store_true", help="stats: the whole object, for scripts")
    p = command("models", cmd_models, "pull, list or remove models")
    p.add_argument("action", choices=["pull", "list", "rm"])
    p.add_argument("name", nargs="?", default="default")
    p.add_argument(
        "--available", action="store_true", help="list: the catalogue, marking what fits here"
    )
    command("serve", cmd_serve, "serve the OpenAI-compatible API")
    p = command("bench", cmd_bench, "measure cold, RAM-hit and disk-hit TTFT side by side")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quick", action="store_true", help="a small workload (for smoke tests)")
    p.add_argument("--system-tokens", type=int, default=2000)
    p.add_argument("--conversations", type=int, default=20)
    p = command(
        "doctor", cmd_doctor, "print the machine, its measurements and the thresholds chosen"
    )
    p.add_argument("--json", action="store_true")
    # the app has options of its own (main() hands `warmstart app --help` to it); it is
    # a client of the HTTP API, so the runtime's settings reach it through its server
    p = command(
        "app", cmd_app, "open the desktop app (options: warmstart app --help)", settings=False
    )
    p.add_argument("app_args", nargs=argparse.REMAINDER, help="options for the app")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    restrict_umask()  # everything written from here on is the user's alone (0600/0700)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["app"]:
        return run_app(argv[1:])  # every option after `app` is the app's own, --help too
    parser = build_parser(show_all="--help-all" in argv)
    args = parser.parse_args(argv)
    if getattr(args, "check", None) is not None:
        args.check(args)  # a usage error argparse cannot express: exits 2 like one
    level = logging.WARNING - 10 * args.verbose
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.fn(args))
        sys.stdout.flush()  # inside the try: a reader that left shows up here, not at exit
        return code
    except WarmstartError as exc:
        print(f"warmstart: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_left()


def _reader_left() -> int:
    """The reader of our output went away (``| head``): it asked for less, which is not
    an error. stdout is pointed at /dev/null so that the interpreter's final flush
    does not raise again (the recipe of Python's signal documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


if __name__ == "__main__":
    sys.exit(main())
