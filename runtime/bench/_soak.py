"""`make bench-soak`: a day of a household server's load, compressed (issue 43).

A real ``warmstart serve`` (the default model, a fresh data dir, calibrated first by
``warmstart doctor``) with two keys made by ``warmstart keys add``; two users with
four clients each (`_soak_load`) for ``--minutes``; the server SIGKILLed in the
middle (or earlier, once the cache folder reaches most of its budget, so that what
the durability check needs was not evicted by the budget) and restarted on the same
data dir; every conversation answered more than ``durable_after_s`` before the kill
continued once after the restart (its cached tokens must cover its previous prompt);
the load again to the end, the disk budget small enough to be filled (and culled);
then a sample of greedy replies asked again of a ``--no-cache`` server on the same
data dir. Prints the report (`_soak_report`), writes it as JSON, exits 1 when a
criterion fails. Figures are from whatever else the machine runs meanwhile.

    python -m warmstart.runtime.bench soak [--minutes 30] [--out soak-report.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..errors import PeerError, WarmstartError
from . import _soak_report as rep
from ._bench_peers import resolve_model
from ._servers import Server, _stop, _tail, free_port, run_checked, server_env
from ._soak_load import Exchange, Household, post, run_client

log = logging.getLogger(__name__)

USERS = ("alice", "bob")
CLIENTS_PER_USER = 4
SAMPLE_EVERY_S = 10.0
# of the disk budget: the kill comes no later, so that nothing is culled before it nor by
# the continued chats after it (captures land in bursts: one run went from 67% to 95%
# of a 160 MiB budget between two 2 s looks, culled 32 chunks before the kill and more
# with the check's own writes, and 12 of 13 chats checked did not restore)
KILL_AT_FILL = 0.5
CLI = [sys.executable, "-m", "warmstart.runtime.cli"]


@dataclass
class Soak:
    """One run's places and settings."""

    model: Path
    home: Path
    minutes: float
    budget: int
    pool: int
    extra: list[str]

    @property
    def data(self) -> Path:
        return self.home / "data"

    def argv(self, port: int, *more: str) -> list[str]:
        where = ["--data-dir", str(self.data), "--model", str(self.model)]
        sizes = ["--disk-budget-bytes", str(self.budget), "--ram-pool-bytes", str(self.pool)]
        return [*CLI, "serve", *where, "--port", str(port), *sizes, *self.extra, *more]


# the server ------------------------------------------------------------------------------
@contextlib.contextmanager
def serving(soak: Soak, phase: str, *more: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A started server (its URL and process); stopped on the way out unless killed."""
    port = free_port()
    logfile = soak.home / f"{phase}.log"
    env = server_env(Server("warmstart", lambda port, _home: soak.argv(port)), soak.home)
    with open(logfile, "wb") as out:
        proc = subprocess.Popen(
            soak.argv(port, *more), env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, logfile)
        yield url, proc
    finally:
        if proc.poll() is None:
            _stop(proc)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], logfile: Path) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PeerError(f"the server exited ({proc.returncode}):\n{_tail(logfile)}")
        with contextlib.suppress(httpx.HTTPError):
            health = httpx.get(f"{url}/health", timeout=5)
            if health.status_code == 200 and "loading" not in health.json():
                return
        time.sleep(0.5)
    raise PeerError(f"the server did not come up in 600 s; see {logfile}")


def add_keys(soak: Soak) -> dict[str, str]:
    """A key per user, as a household's admin makes them (`warmstart keys add`)."""
    keys = {}
    for user in USERS:
        cmd = [*CLI, "keys", "add", user, "--data-dir", str(soak.data)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        found = [w for w in done.stdout.split() if w.startswith("wsk-")]
        if done.returncode != 0 or len(found) != 1:
            raise PeerError(f"warmstart keys add {user} failed: {done.stdout}{done.stderr}")
        keys[user] = found[0]
    return keys


def settings_of(url: str, key: str) -> dict[str, Any]:
    reply = httpx.get(f"{url}/v1/warmstart/settings", headers=_auth(key), timeout=60)
    reply.raise_for_status()
    return {name: entry.get("value") for name, entry in reply.json().items()}


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# watching --------------------------------------------------------------------------------
class Watch:
    """The server process and its cache, every few seconds, on a thread of its own."""

    def __init__(self, soak: Soak, report: rep.Report, key: str) -> None:
        self.soak, self.report, self.key = soak, report, key
        self.began = time.monotonic()
        self.pid = 0
        self.url = ""
        self.culled_before = 0  # the killed process's count
        self.culled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def mark(self, label: str) -> None:
        with contextlib.suppress(OSError):
            self.report.samples.append(rep.ProcSample.of(self.pid, label, self.began))

    def disk(self) -> int:
        cache = self.soak.data / "cache"
        used = rep.folder_bytes(cache) if cache.exists() else 0
        self.report.disk_peak_bytes = max(self.report.disk_peak_bytes, used)
        return used

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.sample()

    def sample(self) -> None:
        """The process, the folder and the server's counts now; a missed one (the server
        down, restarting) is left out."""
        with contextlib.suppress(OSError, httpx.HTTPError, ValueError, KeyError):
            self._sample()

    def _sample(self) -> None:
        proc = rep.ProcSample.of(self.pid, "", self.began)
        used = self.disk()
        stats = httpx.get(f"{self.url}/v1/warmstart/stats", headers=_auth(self.key), timeout=30)
        store = stats.json().get("store", {})
        self.culled = int(store.get("culled", 0))
        self.report.culled_chunks = self.culled_before + self.culled
        self.report.timeline.append(
            {"t_s": proc.t_s, "pid": proc.pid, "rss_bytes": proc.rss_bytes, "fds": proc.fds,
             "disk_bytes": used, "disk_chunks": store.get("disk", {}).get("chunks"),
             "written": store.get("written"), "culled": self.culled}
        )  # fmt: skip


# the phases ------------------------------------------------------------------------------
def load_until(house: Household, watch: Watch, end: float, budget: int) -> None:
    """Lets the clients run until ``end`` (monotonic), or, with ``budget``, until the
    cache folder holds ``KILL_AT_FILL`` of it."""
    said = time.monotonic()
    while time.monotonic() < end:
        if budget and watch.disk() >= KILL_AT_FILL * budget:
            log.info("the cache folder reached %.0f%% of its budget", KILL_AT_FILL * 100)
            return
        if time.monotonic() - said >= 60:
            said = time.monotonic()
            _progress(house, watch)
        time.sleep(2.0)


def _progress(house: Household, watch: Watch) -> None:
    with house.lock:
        done = list(house.exchanges)
    served = sum(ex.ok for ex in done)
    log.info(
        "%5.0f s: %d requests served, %d not; cache folder %.0f MiB",
        time.monotonic() - watch.began, served, len(done) - served, watch.disk() / rep.MiB,
    )  # fmt: skip


def kill(house: Household, watch: Watch, proc: subprocess.Popen[bytes], report: rep.Report) -> None:
    watch.sample()  # the killed process's last counts
    watch.mark("middle (before the kill)")
    house.up.clear()
    report.kill_mono = time.monotonic()
    report.kill_at_s = report.kill_mono - watch.began
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    watch.culled_before, watch.culled = watch.culled, 0
    log.info("SIGKILL at %.0f s", report.kill_at_s)


def check_durable(house: Household, report: rep.Report, durable_s: float, chunk: int) -> None:
    """Each chat answered more than ``durable_s`` before the kill, continued once (the
    clients wait meanwhile). Its cached tokens must cover the canonical chunks of its
    previous prompt: a cold prefill computes whole aligned batches of ``chunk`` tokens
    up to its last two tokens, and only those are stored to restore elsewhere."""
    with httpx.Client(timeout=httpx.Timeout(900, connect=10)) as client:
        for chat in list(house.chats):
            before = report.kill_mono - chat.answered_at
            if not chat.answered_at or before <= durable_s:
                continue
            extra = {"tool_choice": "none"} if chat.tools else {}
            body = {**chat.body(16, **extra), "messages": chat.going_on()}
            ex = house.record(client, chat.user, "durable", body)
            needed = (chat.prompt_tokens - 2) // chunk * chunk
            report.durable.append(
                rep.Durable(chat.user, round(before, 1), chat.prompt_tokens, needed,
                            ex.cached_tokens, ex.status)
            )  # fmt: skip


def pick_sample(exchanges: list[Exchange], each: int) -> list[Exchange]:
    """About ``each`` answered requests per user, spread over the run: before the
    kill, the continued chats after the restart, and the load after it; those that
    restored something first (they are what the check is about)."""
    out: list[Exchange] = []
    groups = (("first", each * 3 // 8), ("durable", each // 4), ("restart", each))
    for user in USERS:
        taken = 0
        for group, n in groups:
            pool = [e for e in exchanges if e.ok and e.user == user and _group(e) == group]
            pool = [e for e in pool if e.cached_tokens > 0] or pool
            n = min(n, each - taken, len(pool))
            out += [pool[i * len(pool) // n] for i in range(n)]
            taken += n
    return out


def _group(ex: Exchange) -> str:
    return "durable" if ex.kind == "durable" else ex.phase


def check_sample(soak: Soak, house: Household, report: rep.Report, each: int) -> None:
    """The sample asked again of a ``--no-cache`` server on the same data dir (the
    same keys, calibration and settings; nothing is read from or written to its cache)."""
    sample = pick_sample(house.exchanges, each)
    with (
        serving(soak, "no-cache", "--no-cache") as (url, _proc),
        httpx.Client(timeout=httpx.Timeout(900, connect=10)) as client,
    ):
        for ex in sample:
            again = post(client, url, house.keys[ex.user], _again(ex))
            same = again.ok and again.text == ex.text
            report.checked.append(
                rep.Checked(ex.user, ex.kind, _group(ex), ex.prompt_tokens, ex.cached_tokens,
                            same, ex.text, again.text or again.error)
            )  # fmt: skip


def _again(ex: Exchange) -> Exchange:
    return Exchange(ex.user, ex.kind, ex.body, "no-cache", time.monotonic())


# the run ---------------------------------------------------------------------------------
def run(soak: Soak, sample_each: int) -> rep.Report:
    run_checked([*CLI, "doctor", "--data-dir", str(soak.data), "--model", str(soak.model)],
                "warmstart doctor")  # fmt: skip
    keys = add_keys(soak)
    report = rep.Report(settings={}, minutes=soak.minutes, disk_budget_bytes=soak.budget)
    watch = Watch(soak, report, keys[USERS[0]])
    with serving(soak, "first") as (url, proc):
        end = time.monotonic() + soak.minutes * 60  # the restart and the checks count in
        settings = settings_of(url, keys[USERS[0]])
        report.settings = {k: settings.get(k) for k in SHOWN}
        house = Household(keys, int(settings["n_ctx"]))
        clients = _start_clients(house, url, watch, proc)
        load_until(house, watch, time.monotonic() + soak.minutes * 30, soak.budget)
        kill(house, watch, proc, report)
    try:
        with serving(soak, "restart") as (url, proc):
            _restarted(house, watch, url, proc)
            durable_s, chunk = float(settings["durable_after_s"]), int(settings["chunk_tokens"])
            check_durable(house, report, durable_s, chunk)
            watch.mark("after the durability check")
            house.up.set()
            load_until(house, watch, end, 0)
            watch.mark("end")
            house.stop.set()
            for thread in clients:
                thread.join()
            watch.sample()  # the last counts, after the last reply
            report.disk_end_bytes = watch.disk()
    finally:
        house.stop.set()
        house.up.set()  # a client still waiting for the server ends
        watch.close()
    report.exchanges = house.exchanges
    check_sample(soak, house, report, sample_each)
    for phase in ("first", "restart", "no-cache"):
        report.log_errors[f"{phase}.log"] = rep.log_errors(soak.home / f"{phase}.log")
    return report


SHOWN = (
    "n_ctx", "resident_sequences", "chunk_tokens", "ram_pool_bytes", "disk_budget_bytes",
    "durable_after_s", "decode_batch",
)  # fmt: skip


def _start_clients(
    house: Household, url: str, watch: Watch, proc: subprocess.Popen[bytes]
) -> list[threading.Thread]:
    watch.pid, watch.url, house.url = proc.pid, url, url
    watch.mark("start")
    watch.start()
    house.up.set()
    clients = [
        threading.Thread(target=run_client, args=(house, user, 1000 * u + c), daemon=True)
        for u, user in enumerate(USERS)
        for c in range(CLIENTS_PER_USER)
    ]
    for thread in clients:
        thread.start()
    return clients


def _restarted(house: Household, watch: Watch, url: str, proc: subprocess.Popen[bytes]) -> None:
    watch.pid, watch.url, house.url = proc.pid, url, url
    house.phase = "restart"
    watch.mark("after the restart")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m warmstart.runtime.bench soak",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--minutes", type=float, default=30.0, help="of load (default %(default)s)")
    p.add_argument(
        "--disk-budget-mb",
        type=float,
        default=None,
        help=f"the cache's disk budget (default {BUDGET_MB_PER_MINUTE:g} MiB a minute of load: "
        "about what this run writes in two thirds of its time, so that it fills)",
    )
    p.add_argument(
        "--ram-pool-mb", type=float, default=256, help="the RAM pool (default %(default)s MiB)"
    )
    p.add_argument("--model", default="default", help="as `make bench-peers` takes it")
    p.add_argument("--sample", type=int, default=8, help="replies checked per user")
    p.add_argument("--out", type=Path, default=Path("soak-report.json"), help="the JSON report")
    p.add_argument("--keep", type=Path, default=None, help="a folder to keep the run in")
    p.add_argument("--warmstart-args", default="", help="more `warmstart serve` settings")
    return p.parse_args(argv)


BUDGET_MB_PER_MINUTE = 40.0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    args = parse_args(argv)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # servers stop too
    try:
        with _home(args.keep) as home:
            budget = args.disk_budget_mb or BUDGET_MB_PER_MINUTE * args.minutes
            soak = Soak(
                resolve_model(args.model), home, args.minutes, int(budget * rep.MiB),
                int(args.ram_pool_mb * rep.MiB), args.warmstart_args.split(),
            )  # fmt: skip
            report = run(soak, args.sample)
    except WarmstartError as exc:
        print(f"bench soak: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(rep.render(report))
    args.out.write_text(json.dumps(rep.to_json(report), indent=1) + "\n")
    print(f"written to {args.out}")
    return 0 if all(report.criteria().values()) else 1


@contextlib.contextmanager
def _home(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        yield Path(tmp)
