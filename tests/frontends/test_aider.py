"""aider, a coding agent, against warmstart's OpenAI route in a small git repository.

Two ``--message`` edits in a row, as separate runs, the second restoring the first's
chat history (``--restore-chat-history``), as a user continues a task. aider resends
its system prompt, its examples and the repository map every time: the second run's
first request must find all of that cached (the proxy reads warmstart's report).

aider orders a request as system prompt, examples, repository map, earlier exchanges,
the files in the chat, the new message (aider/coders/chat_chunks.py), and the first
run's message carried its reminder text. So the second run's prompt stops matching the
first one's where the first exchange begins: the repository map is the prefix a later
run can share, the first exchange is computed again (then cached for a third run).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import Server
from tests.api.inproc import serving

from .proxy import Exchange, Recorder, recording_app

MODEL = "smollm2-135m"
FILES = {
    "shapes/__init__.py": '"""Plane shapes."""\n',
    "shapes/circle.py": (
        "import math\n\n\ndef area(radius):\n    return math.pi * radius**2\n\n\n"
        "def circumference(radius):\n    return 2 * math.pi * radius\n"
    ),
    "shapes/square.py": (
        "def area(side):\n    return side * side\n\n\ndef perimeter(side):\n    return 4 * side\n"
    ),
    "shapes/report.py": (
        "from . import circle, square\n\n\ndef describe(kind, size):\n"
        '    if kind == "circle":\n        return f"circle of area {circle.area(size):.2f}"\n'
        '    return f"square of area {square.area(size)}"\n'
    ),
    "README.md": "# shapes\n\nAreas and perimeters of plane shapes.\n",
}
EDITS = (
    "Add a function diagonal(side) to shapes/square.py that returns side * math.sqrt(2).",
    "Now add a docstring to every function in shapes/square.py.",
)


def _repo(path: Path) -> None:
    for name, text in FILES.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git = ["git", "-C", str(path)]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    # the repository's own identity: aider commits its edits with it
    subprocess.run([*git, "config", "user.name", "Test"], check=True)
    subprocess.run([*git, "config", "user.email", "test@example.com"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "shapes"], check=True)


def aider_args(base_url: str, message: str, *more: str) -> list[str]:
    """aider's settings for warmstart (docs/api.md gives the same as a config file)."""
    return [
        "--model", f"openai/{MODEL}",
        "--openai-api-base", base_url + "/v1",
        "--openai-api-key", "local",
        "--model-metadata-file", "model-metadata.json",
        "--model-settings-file", "model-settings.yml",
        "--no-show-model-warnings", "--no-check-update", "--no-analytics",
        "--no-show-release-notes", "--no-pretty", "--no-fancy-input", "--yes-always",
        "--message", message, *more,
    ]  # fmt: skip


def _metadata(workdir: Path, n_ctx: int) -> None:
    """Tells aider (through litellm) the context warmstart serves, so it fits its
    prompt to it instead of guessing."""
    card = {"max_input_tokens": n_ctx, "max_output_tokens": 512, "max_tokens": n_ctx}
    card |= {"input_cost_per_token": 0, "output_cost_per_token": 0}
    card["litellm_provider"] = "openai"
    card["mode"] = "chat"
    (workdir / "model-metadata.json").write_text(json.dumps({f"openai/{MODEL}": card}))


def _settings(workdir: Path) -> None:
    """Replies held to 200 tokens: the small default model can repeat a line until it
    reaches the context's end, which took minutes a reply on a busy 2-core machine."""
    (workdir / "model-settings.yml").write_text(
        f"- name: openai/{MODEL}\n  edit_format: whole\n  extra_params:\n    max_tokens: 200\n"
    )


def _run_aider(venv: Path, repo: Path, home: Path, args: list[str], log: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AIDER_"))}
    # a home of its own (aider keeps analytics and caches there); litellm's price table
    # from its package, not from GitHub
    env |= {"HOME": str(home), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with log.open("ab") as out:
        done = subprocess.run(
            [str(venv / "bin" / "aider"), *args], cwd=repo, env=env, stdout=out, stderr=out
        )
    assert done.returncode == 0, log.read_text(errors="replace")


def _prefix_tokens(base_url: str, body: dict[str, object]) -> int:
    """Tokens of the messages up to the repository map and aider's "Ok" after it
    (their text alone: the chat template's few tokens around each are not counted)."""
    messages = body["messages"]
    assert isinstance(messages, list)
    text = ""
    for i, message in enumerate(messages):
        content = message["content"]
        text += content if isinstance(content, str) else content[0]["text"]
        if "Here are summaries of some files" in str(content):
            text += str(messages[i + 1]["content"])
            break
    else:
        raise AssertionError("no repository map in aider's request")
    counted = httpx.post(base_url + "/tokenize", json={"content": text}).json()
    return len(counted["tokens"])


@pytest.mark.timeout(1800)
def test_aider_two_edits(warmstart: Server, venvs: Path, out_dir: Path, tmp_path: Path) -> None:
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    _repo(repo)
    n_ctx = httpx.get(warmstart.v1 + "/models").json()["data"][0]["n_ctx"]
    _metadata(repo, n_ctx)
    _settings(repo)
    log, routes = out_dir / "aider.log", out_dir / "routes-aider.log"
    log.write_text("")
    routes.write_text("")
    recorder = Recorder(log=routes)
    with serving(recording_app(warmstart.base_url, recorder)) as proxy:
        first = aider_args(proxy, EDITS[0], "shapes/square.py")
        _run_aider(venvs / "aider", repo, home, first, log)
        runs = len([e for e in recorder.snapshot() if e.is_generation])
        second = aider_args(proxy, EDITS[1], "--restore-chat-history", "shapes/square.py")
        _run_aider(venvs / "aider", repo, home, second, log)
    exchanges = recorder.snapshot()
    lines = [e.line() for e in exchanges]
    asks: list[Exchange] = [e for e in exchanges if e.is_generation]
    assert asks and len(asks) > runs, lines
    later = asks[runs]
    prefix = _prefix_tokens(warmstart.base_url, later.body or {})
    summary = {
        "requests": lines,
        "second_run_first_request": [later.cached_tokens, later.prompt_tokens],
        "system_examples_and_repo_map_tokens": prefix,
        "commits": subprocess.run(
            ["git", "-C", str(repo), "log", "--oneline"], capture_output=True, text=True
        ).stdout.splitlines(),
    }
    (out_dir / "aider.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    assert not [e for e in exchanges if e.status >= 400], lines
    assert later.cached_tokens >= prefix, summary
