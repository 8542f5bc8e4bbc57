"""Open WebUI driven as a person does, in Debian's Chromium through Playwright.

Playwright never downloads a browser here: it launches /usr/bin/chromium (installed by
installers/linux/system-deps.sh frontends) with a fresh profile and the flags below,
and every request the page makes off Open WebUI's own origin is refused, so the run
is offline whatever the page would fetch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

from .proxy import Recorder

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADMIN = {"name": "Test Admin", "email": "admin@example.com", "password": "warmstart-frontends"}
REPLY_TIMEOUT_S = 1500.0  # a reply and its background tasks, on a busy 2-core machine
QUIET_S = 6.0  # no request open for this long: Open WebUI's background tasks are done
SEND_WAIT_S = 30.0  # a message Open WebUI takes leaves its input empty within this
SEND_TRIES = 3


@contextlib.contextmanager
def browser_page(profile: Path, base_url: str, refused: list[str]) -> Iterator[Page]:
    """A page in a fresh Chromium profile; URLs off ``base_url`` go into ``refused``."""
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(60_000)

            def only_local(route):  # type: ignore[no-untyped-def]
                if route.request.url.startswith(base_url):
                    return route.continue_()
                refused.append(route.request.url)
                return route.abort()

            page.route("**/*", only_local)
            yield page
        finally:
            context.close()


class OpenWebUI:
    """The steps of the test, each as a user takes it in Open WebUI's page."""

    def __init__(self, page: Page, base_url: str, recorder: Recorder) -> None:
        self.page, self.base_url, self.recorder = page, base_url, recorder

    def create_admin(self) -> None:
        """The first visit: "Get started", then the admin account's form."""
        self.page.goto(self.base_url)
        self.page.get_by_role("button", name="Get started").click()
        self.page.fill("#name", ADMIN["name"])
        self.page.fill("#email", ADMIN["email"])
        self.page.fill("#password", ADMIN["password"])
        self.page.get_by_role("button", name="Create Admin Account").click()
        self.page.locator("#chat-input").wait_for()
        news = self.page.get_by_role("button", name="Okay, Let's Go!")
        with contextlib.suppress(Exception):  # the release notes show on a first visit only
            news.click(timeout=10_000)

    def models_in_picker(self) -> list[str]:
        """Opens the model picker and returns its entries' labels (picker left open)."""
        self.page.locator("[id^=model-selector][id$=-button]").first.click()
        options = self.page.get_by_role("option")
        options.first.wait_for()
        return [str(o.get_attribute("aria-label")) for o in options.all()]

    def pick_model(self, label: str) -> None:
        self.page.get_by_role("option", name=label).click()

    def send(self, text: str) -> None:
        """Types ``text`` into the chat input and sends it with Enter, as a person does.
        A page still rendering on a busy machine may drop the Enter or the keys (a run
        waited 25 minutes after a new chat for a request Open WebUI never sent: its log
        has no POST for it): sent is when the input is empty again, and until it is,
        Enter is pressed again (the text typed again where the keys were lost)."""
        box = self.page.locator("#chat-input")
        for _ in range(SEND_TRIES):
            box.click()
            if box.inner_text().strip() != text:
                self.page.keyboard.press("Control+A")
                self.page.keyboard.press("Delete")
                self.page.keyboard.type(text)
            self.page.keyboard.press("Enter")
            deadline = time.monotonic() + SEND_WAIT_S
            while time.monotonic() < deadline:
                if not box.inner_text().strip():
                    return
                time.sleep(0.5)
        raise TimeoutError(f"Open WebUI kept {text!r} in its input after {SEND_TRIES} Enters")

    def regenerate(self) -> None:
        """The last reply's "Regenerate", then "Try Again" in the menu it opens (Open
        WebUI 0.12's menu, which also offers a suggested change, "Add Details" and "More
        Concise"; its entries are buttons). The button alone sends nothing."""
        self.page.locator(".chat-assistant").last.hover()
        self.page.locator('[aria-label="Regenerate"]').last.click()
        self.page.get_by_role("button", name="Try Again").click()

    def new_chat(self) -> None:
        self._open_sidebar()
        self.page.locator("#sidebar-new-chat-button:visible").first.click()
        self.page.wait_for_url(self.base_url + "/")

    def open_chat(self, path: str) -> None:
        """A chat from the sidebar's list, by its link (e.g. /c/<id>)."""
        self._open_sidebar()
        self.page.locator(f'a[href="{path}"]:visible').first.click()
        self.page.wait_for_url(self.base_url + path)

    def _open_sidebar(self) -> None:
        """Open WebUI 0.12 starts with its sidebar folded to a rail of icons (its "New
        Chat" button is then a hidden one, and the chat list is not shown): its logo,
        "Open Sidebar", unfolds it, as a person does to find an earlier chat."""
        opener = self.page.locator('[aria-label="Open Sidebar"]:visible')
        if opener.count():
            opener.first.click()
        self.page.locator("#sidebar-new-chat-button:visible").first.wait_for()

    def chat_path(self) -> str:
        return self.page.url.removeprefix(self.base_url)

    def settle(self, chats: int) -> None:
        """Waits until warmstart has answered ``chats`` chat requests in all and no
        request (Open WebUI's background tasks after a reply) was open for QUIET_S."""
        start = time.monotonic()
        while time.monotonic() < start + REPLY_TIMEOUT_S:
            done = [e for e in self.recorder.snapshot() if e.is_user_chat]
            if len(done) >= chats and self.recorder.quiet_for() >= QUIET_S:
                self.page.wait_for_timeout(1000)  # the page renders what came last
                print(f"chat request {chats} settled in {time.monotonic() - start:.0f} s")
                return
            time.sleep(0.5)
        raise TimeoutError(f"no settled reply {chats} after {REPLY_TIMEOUT_S} s")
