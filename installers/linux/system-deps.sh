#!/bin/sh
# Debian/Ubuntu packages the desktop app (PySide6) needs, plus Xvfb for headless
# screenshots and GUI tests in CI, and the tools the installer tests check with
# (desktop-file-validate, systemd-analyze, runuser from util-linux). Idempotent: installs only what is missing.
# Usage: sudo installers/linux/system-deps.sh   (or as root in CI)
#        sudo installers/linux/system-deps.sh frontends   (adds Debian's Chromium, which
#        `make test-frontends` drives Open WebUI in: Playwright never downloads a browser)
set -eu

PACKAGES="
libegl1 libgl1 libopengl0 libglib2.0-0 libfontconfig1 libfreetype6 libdbus-1-3
libxkbcommon0 libxkbcommon-x11-0
libxcb1 libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0
libxcb-render-util0 libxcb-shape0 libxcb-xinerama0 libxcb-xkb1 libxcb-xfixes0
libx11-xcb1 libxrender1 libxi6
fonts-dejavu-core
xvfb xauth
desktop-file-utils systemd util-linux
"
case "${1:-}" in
    "") ;;
    frontends) PACKAGES="$PACKAGES chromium" ;;
    *) echo "system-deps: unknown group '$1' (known: frontends)" >&2; exit 2 ;;
esac

missing=""
for pkg in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done

if [ -z "$missing" ]; then
    echo "system-deps: all present"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "system-deps: installing$missing"
$SUDO apt-get update -qq
# shellcheck disable=SC2086  # the list is meant to split into words
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
