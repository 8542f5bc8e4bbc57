"""Fast checks of every installer file, including those that cannot run here
(Windows, macOS, the container: no such system or engine on this machine)."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from .helpers import REPO

SHELL_SCRIPTS = (
    "installers/linux/install.sh",
    "installers/linux/install-server.sh",
    "installers/linux/system-deps.sh",
    "installers/macos/install.sh",
)


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shell_syntax(script: str) -> None:
    assert subprocess.run(["sh", "-n", str(REPO / script)]).returncode == 0
    if shutil.which("shellcheck"):
        checked = subprocess.run(["shellcheck", "-S", "warning", str(REPO / script)])
        assert checked.returncode == 0


@pytest.mark.parametrize(
    "script",
    [
        "installers/linux/install.sh",
        "installers/linux/install-server.sh",
        "installers/macos/install.sh",
    ],
)
def test_help_and_bad_options(script: str) -> None:
    helped = subprocess.run(["sh", str(REPO / script), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "--uninstall" in helped.stdout
    assert "set -eu" not in helped.stdout and "#" not in helped.stdout  # the comment only
    assert helped.stdout.splitlines()[0].startswith("warmstart")
    bad = subprocess.run(["sh", str(REPO / script), "--bogus"], capture_output=True, text=True)
    assert bad.returncode != 0 and "unknown option --bogus" in bad.stderr


def test_desktop_template_fills_to_a_valid_entry(tmp_path: Path) -> None:
    template = (REPO / "assets/warmstart.desktop.in").read_text()
    entry = tmp_path / "warmstart.desktop"
    filled = template.replace("@EXEC@", "/home/u/.local/bin/warmstart")
    entry.write_text(filled.replace("@ICON@", "warmstart"))
    if shutil.which("desktop-file-validate") is None:
        pytest.skip("desktop-file-validate is missing (Debian package desktop-file-utils)")
    checked = subprocess.run(["desktop-file-validate", str(entry)], capture_output=True, text=True)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout


def test_macos_launchd_agent(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        ["sh", str(REPO / "installers/macos/install.sh"), "--plist"],
        env=env, capture_output=True, check=True,
    ).stdout  # fmt: skip
    agent = plistlib.loads(out)
    support = f"{tmp_path}/Library/Application Support/warmstart"
    assert agent["ProgramArguments"] == [f"{support}/venv/bin/warmstart", "serve"]
    assert agent["RunAtLoad"] is True and agent["KeepAlive"] == {"SuccessfulExit": False}
    refused = subprocess.run(
        ["sh", str(REPO / "installers/macos/install.sh")], env=env, capture_output=True, text=True
    )
    if shutil.which("sw_vers") is None:  # not a Mac: it says so instead of half-installing
        assert refused.returncode != 0 and "macOS installer" in refused.stderr
    assert "GGML_METAL=on" in (REPO / "installers/macos/install.sh").read_text()


def test_windows_script_names_its_requirements() -> None:
    text = (REPO / "installers/windows/install.ps1").read_text()
    assert "Visual Studio 2022 Build Tools" in text
    assert "Microsoft.VisualStudio.Workload.VCTools" in text
    assert "vswhere" in text and "GGML_CUDA=on" in text and "UNTESTED" in text


def test_container_files_agree() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((REPO / "installers/container/compose.yaml").read_text())
    service = compose["services"]["warmstart"]
    context = (REPO / "installers/container" / service["build"]["context"]).resolve()
    assert context == REPO
    text = (context / service["build"]["dockerfile"]).read_text()
    (secret,) = service["secrets"]
    assert f"WARMSTART_API_KEY_FILE=/run/secrets/{secret}" in text
    assert compose["secrets"][secret]["file"] == "./api-key"
    assert any(v.endswith(":/var/lib/warmstart") for v in service["volumes"])
    assert "ARG CUDA=0" in text and "-DGGML_CUDA=on" in text and "USER warmstart" in text
    # the wheel cache all install paths share, kept between image builds
    assert "--mount=type=cache,target=/root/.cache/warmstart/llama-wheels" in text
    assert "installers/llama_wheel.py --version" in text


def test_license_matches_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_readme_install_section() -> None:
    text = (REPO / "README.md").read_text()
    assert "## Install" in text and "untested" in text.lower()
    for line in ("installers/linux/install.sh", "sudo installers/linux/install-server.sh",
                 "docker compose -f installers/container/compose.yaml", "--uninstall"):  # fmt: skip
        assert line in text
    assert "```sh\nmake run\n```" in text and "```sh\nmake test\n```" in text
