"""The commands on what is stored: conversations (sessions), the KV cache (cache) and
model files (models). Through the running server when one answers (it owns the store),
else on the files: either way no model is loaded. Output here is the CLI's own: print
is allowed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..settings import Settings
from ._flags import settings_from


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
            if found.get("last_divergence"):
                print(f"last prompt recomputed from {found['last_divergence']}")
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
