"""installers/linux/install-server.sh as root in a scratch root, and its unit run for real.

systemd is not PID 1 here, so the unit cannot be started; instead the test runs
its exact ExecStart, User= and Environment= (paths under the scratch root) with
$CREDENTIALS_DIRECTORY and $NOTIFY_SOCKET set as systemd would set them.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shlex
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .helpers import REPO, SYSTEM_PATH, need_root, pip_env, seed_wheel_cache, start_on, stop

pytestmark = pytest.mark.slow

USER = "wstest-server"
PATHS = ("/opt/warmstart", "/etc/warmstart", "/var/lib/warmstart")
HARDENING = (
    "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
    "ReadWritePaths=/var/lib/warmstart", "Restart=on-failure", "Type=notify",
    "StateDirectory=warmstart", "LoadCredential=warmstart-api-key:/etc/warmstart/api-key",
)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, scratch: Path, wheelhouse: Path) -> None:
        self.root = scratch / "root"
        self.root.mkdir()
        self.port = _free_port()
        (scratch / "pip-cache").mkdir()
        self.wheel = seed_wheel_cache(scratch)  # root's cache, as `make run` leaves it
        self.env = {"PATH": SYSTEM_PATH, "HOME": str(scratch), "LANG": "C.UTF-8"}
        self.env.update(pip_env(wheelhouse, scratch / "pip-cache"))
        self.unit = self.root / "etc/systemd/system/warmstart.service"
        self.key = self.root / "etc/warmstart/api-key"
        self.state = self.root / "var/lib/warmstart"

    def run(self, *flags: str) -> subprocess.CompletedProcess[str]:
        argv = ["sh", str(REPO / "installers/linux/install-server.sh"), "--root", str(self.root),
                "--service-user", USER, "--cpu", *flags]  # fmt: skip
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=900)

    def install(self, *flags: str) -> str:
        proc = self.run(*flags)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    def directives(self, name: str) -> list[str]:
        prefix = name + "="
        lines = self.unit.read_text().splitlines()
        return [line[len(prefix) :] for line in lines if line.startswith(prefix)]

    def in_root(self, text: str) -> str:
        for path in PATHS:
            text = text.replace(path, f"{self.root}{path}")
        return text


@pytest.fixture
def server(scratch: Path, wheelhouse: Path) -> Iterator[Server]:
    need_root()
    yield Server(scratch, wheelhouse)
    if subprocess.run(["id", USER], capture_output=True).returncode == 0:  # a failed run
        subprocess.run(["userdel", USER], check=False)


def _mode(path: Path) -> tuple[int, str, str]:
    st = path.stat()
    return (
        stat.S_IMODE(st.st_mode),
        pwd.getpwuid(st.st_uid).pw_name,
        grp.getgrgid(st.st_gid).gr_name,
    )


def _check_layout(server: Server) -> None:
    entry = pwd.getpwnam(USER)
    assert entry.pw_uid < 1000 and entry.pw_dir == "/var/lib/warmstart"
    assert entry.pw_shell.endswith("nologin")
    assert _mode(server.key) == (0o600, "root", "root")
    assert _mode(server.state) == (0o700, USER, USER)
    assert _mode(server.root / "etc/warmstart/warmstart.toml")[1:] == ("root", "root")
    assert _mode(server.root / "opt/warmstart/venv/bin/python")[1] == "root"
    assert next((server.state / "models").glob("*.gguf")).stat().st_uid == entry.pw_uid


def _check_unit(server: Server) -> None:
    text = server.unit.read_text()
    for line in HARDENING:
        assert line in text.splitlines(), line
    assert server.key.read_text().strip() not in text  # the key is never in the unit
    assert ("DeviceAllow=" in text) == os.path.exists("/dev/nvidia0")
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is missing (Debian package systemd)")
    # --root needs the distribution's units beside ours (sysinit.target and friends)
    shutil.copytree(
        "/usr/lib/systemd/system", server.root / "usr/lib/systemd/system", symlinks=True
    )
    verify = subprocess.run(
        ["systemd-analyze", "verify", f"--root={server.root}", "warmstart.service"],
        capture_output=True,
        text=True,
    )
    ours = [line for line in verify.stderr.splitlines() if "warmstart" in line]
    assert verify.returncode == 0 and not ours, verify.stderr


def _run_exec_start(server: Server, scratch: Path) -> None:
    """ExecStart as User= with the credential and a notify socket, as systemd would."""
    creds = scratch / "credentials"
    creds.mkdir(mode=0o500)
    shutil.copyfile(server.key, creds / "warmstart-api-key")
    uid = pwd.getpwnam(USER).pw_uid
    os.chown(creds / "warmstart-api-key", uid, -1)
    os.chmod(creds / "warmstart-api-key", 0o400)
    os.chown(creds, uid, -1)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(scratch / "notify.sock"))
    os.chmod(scratch / "notify.sock", 0o777)
    notify.settimeout(240)
    env = dict(item.split("=", 1) for item in server.directives("Environment"))
    env = {k: server.in_root(v) for k, v in env.items()}
    env.update(PATH=SYSTEM_PATH, CREDENTIALS_DIRECTORY=str(creds),
               NOTIFY_SOCKET=str(scratch / "notify.sock"))  # fmt: skip
    (exec_start,) = server.directives("ExecStart")
    argv = shlex.split(server.in_root(exec_start))
    (user,) = server.directives("User")
    cmd = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    key = server.key.read_text().strip()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = notify.recv(4096).decode()  # READY=1 comes once /health answers
        assert "READY=1" in ready
        base = f"http://127.0.0.1:{server.port}"
        assert httpx.get(f"{base}/v1/models").status_code == 401
        wrong = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer nope-nope"})
        assert wrong.status_code == 401
        good = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"})
        assert good.status_code == 200 and good.json()["data"]
        # the admin's `sudo warmstart` finds the service and gets in with its key
        stats = _wrapper(server, "cache", "stats", "--json")
        assert stats.returncode == 0, stats.stderr
        assert "source" not in json.loads(stats.stdout)  # the server's stats, not the files'
        # and gives a person a key, which the running service takes at once
        added = _wrapper(server, "keys", "add", "alice")
        assert added.returncode == 0, added.stderr
        alice = next(w for w in added.stdout.split() if w.startswith("wsk-"))
        theirs = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {alice}"})
        assert theirs.status_code == 200
        keys = server.state / "keys.json"
        assert alice not in keys.read_text() and keys.stat().st_uid == pwd.getpwnam(USER).pw_uid
    finally:
        notify.close()
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert key not in out  # never logged


def test_install_serve_upgrade_uninstall(server: Server, scratch: Path) -> None:
    out = server.install("--host", "127.0.0.1", "--port", str(server.port))
    assert f"http://127.0.0.1:{server.port}/v1" in out
    assert 'curl -H "Authorization: Bearer $(sudo cat /etc/warmstart/api-key)"' in out
    _check_layout(server)
    _check_unit(server)
    _run_exec_start(server, scratch)

    key = server.key.read_text()
    marker = server.state / "kept.txt"
    marker.write_text("state")
    server.install("--upgrade")
    assert server.key.read_text() == key and marker.read_text() == "state"
    assert f"port = {server.port}" in (server.root / "etc/warmstart/warmstart.toml").read_text()
    _check_layout(server)

    server.install("--uninstall")
    assert not server.unit.exists() and not (server.root / "opt/warmstart").exists()
    assert server.key.read_text() == key and marker.is_file()

    server.install("--uninstall", "--purge")
    assert not server.state.exists() and not (server.root / "etc/warmstart").exists()
    assert subprocess.run(["id", USER], capture_output=True).returncode != 0


def _as_service(server: Server, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {"PATH": SYSTEM_PATH, "HOME": str(server.state), "WARMSTART_DATA_DIR": str(server.state)}
    cmd = ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")


def test_failed_then_repaired_install(server: Server, scratch: Path) -> None:
    """The issue's case: root's python3 is one the service user cannot reach (pyenv's
    under /root), and a venv made from it was left behind. The run that names it fails
    at once and says why; the next run repairs: a system Python, a venv made again."""
    hidden = scratch / "root-only"
    (hidden / "bin").mkdir(parents=True)
    hidden.chmod(0o700)
    python = hidden / "bin/python3"
    python.symlink_to("/usr/bin/python3")  # the venv links through it, as pyenv's does
    venv = server.root / "opt/warmstart/venv"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(venv)], check=True)

    failed = server.run("--python", str(python), "--no-model")
    assert failed.returncode != 0 and f"the user {USER} cannot run {python}" in failed.stderr

    server.env["PATH"] = f"{hidden / 'bin'}:{SYSTEM_PATH}"  # root's PATH finds it first
    started = time.monotonic()
    proc = server.run("--no-model", "--host", "127.0.0.1", "--port", str(server.port))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"\nrepaired server install: {time.monotonic() - started:.0f} s")  # for the README
    out = proc.stdout
    assert f"recreating {venv}: the user {USER} cannot run it" in out
    assert f"using /usr/bin/python3: the user {USER} cannot run {python}" in out
    assert "reusing the compiled llama-cpp-python 0.3.36" in proc.stderr  # nothing compiled
    assert not os.path.realpath(venv / "bin/python").startswith(str(hidden))
    assert _as_service(server, [str(venv / "bin/python"), "-c", ""]).returncode == 0
    # --root starts nothing, and the summary says so instead of claiming a live URL
    assert f"will serve http://127.0.0.1:{server.port}/v1 once started" in out
    assert "sudo warmstart models pull NAME" in out
    _check_unit(server)
    assert server.directives("StartLimitBurst") == ["5"]  # a bounded retry, not a loop
    _check_wrapper(server)
    _check_vanished_address(server, venv)

    # every interface, under --root: this machine's address is not the target's
    out = server.install("--no-model", "--host", "0.0.0.0")
    assert f"will serve http://SERVER-ADDRESS:{server.port}/v1 once started" in out
    assert "creating the virtual" not in out  # the venv of the repaired run is kept

    running = start_on(venv / "bin/python", USER)  # a server started by hand, say
    try:
        out = server.install("--uninstall", "--purge")
        assert f"stopping what runs from {venv}" in out and running.wait(timeout=30) != 0
    finally:
        stop(running, venv / "bin/python")
    assert not (server.root / "usr/local/bin/warmstart").exists()
    assert subprocess.run(["id", USER], capture_output=True).returncode != 0


def _wrapper(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    """The admin's command, its paths under the scratch root, run as root."""
    script = server.in_root((server.root / "usr/local/bin/warmstart").read_text())
    argv = ["sh", "-c", script, "warmstart", *args]
    env = {"PATH": SYSTEM_PATH}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd="/")


def _check_wrapper(server: Server) -> None:
    """`sudo warmstart ...` works on the service's data, as the service user."""
    wrapper = server.root / "usr/local/bin/warmstart"
    assert stat.S_IMODE(wrapper.stat().st_mode) == 0o755
    stats = _wrapper(server, "cache", "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["source"] == "files (no server answered)"
    uid = pwd.getpwnam(USER).pw_uid
    assert all(p.stat().st_uid == uid for p in server.state.rglob("*"))  # nothing root's


def _check_vanished_address(server: Server, venv: Path) -> None:
    """A --host this machine lacks (a DHCP lease gone): one clear line, exit 2, at once."""
    key = "k" * 32
    gone = _as_service(server, [str(venv / "bin/warmstart"), "serve", "--host", "192.0.2.1",
                                "--port", str(server.port), "--api-key", key])  # fmt: skip
    assert gone.returncode == 2
    lines = gone.stderr.strip().splitlines()
    assert lines == ["warmstart: host: '192.0.2.1' is not an address of this machine"], lines
