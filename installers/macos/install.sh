#!/bin/sh
# warmstart on macOS for one user (no sudo). UNTESTED: written for macOS 13+ on Apple
# silicon and Intel, but never run on a Mac by the project; reports welcome.
#
#   installers/macos/install.sh              install (again: repairs)
#   installers/macos/install.sh --service    also run the local API at login (launchd agent)
#   installers/macos/install.sh --upgrade    new program; models, caches, conversations kept
#   installers/macos/install.sh --uninstall [--purge]   remove it; --purge removes your data
#   installers/macos/install.sh --plist      print the launchd agent it would install
#
# Needs: Python 3.11+ (python.org or Homebrew: brew install python@3.11) and the Xcode
# Command Line Tools (xcode-select --install): llama-cpp-python compiles from source,
# with Metal on Apple silicon (CMAKE_ARGS=-DGGML_METAL=on), for the CPU on Intel Macs.
# Other options: --no-model, --source DIR|SPEC, --python PYTHON.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
SOURCE=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python3}
MODE=install
SERVICE=0
PURGE=0
PULL_MODEL=1

die() { echo "warmstart install: $*" >&2; exit 1; }
say() { echo "==> $*"; }
usage() {  # the comment block at the top of this file, without the '#'s
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

: "${HOME:?HOME is not set}"
# platformdirs' macOS locations, where warmstart itself looks
SUPPORT="$HOME/Library/Application Support/warmstart"   # models, cache, sessions, config
VENV="$SUPPORT/venv"
LOGS="$HOME/Library/Logs/warmstart"
CACHES="$HOME/Library/Caches/warmstart"
BIN_DIR="$HOME/.local/bin"
LAUNCHER="$BIN_DIR/warmstart"
LABEL=org.warmstart.api
PLIST="$HOME/Library/LaunchAgents/$LABEL.plist"

plist() {
    cat <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key><string>$LABEL</string>
  <key>ProgramArguments</key>
  <array>
    <string>$VENV/bin/warmstart</string>
    <string>serve</string>
  </array>
  <key>RunAtLoad</key><true/>
  <!-- restart after a crash, not after a clean stop -->
  <key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>
  <key>ThrottleInterval</key><integer>10</integer>
  <key>ProcessType</key><string>Interactive</string>
  <key>StandardOutPath</key><string>$LOGS/api.log</string>
  <key>StandardErrorPath</key><string>$LOGS/api.log</string>
</dict>
</plist>
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        --service) SERVICE=1 ;;
        --upgrade) MODE=upgrade ;;
        --uninstall) MODE=uninstall ;;
        --purge) PURGE=1 ;;
        --no-model) PULL_MODEL=0 ;;
        --plist) plist; exit 0 ;;
        --source) shift; SOURCE=${1:?--source needs a value} ;;
        --python) shift; PYTHON=${1:?--python needs a value} ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done
[ "$(uname -s)" = Darwin ] || die "this is the macOS installer; on Linux use installers/linux/install.sh"
[ "$PURGE" = 0 ] || [ "$MODE" = uninstall ] || die "--purge goes with --uninstall"

agent_off() {
    launchctl bootout "gui/$(id -u)/$LABEL" >/dev/null 2>&1 || true
}

uninstall() {
    say "removing warmstart (program, launcher, launchd agent)"
    agent_off
    rm -f "$PLIST"
    case "$(readlink "$LAUNCHER" 2>/dev/null || true)" in "$VENV"/*) rm -f "$LAUNCHER" ;; esac
    rm -rf "$VENV"
    if [ "$PURGE" = 1 ]; then
        say "purging models, KV cache, conversations, settings and logs"
        rm -rf "$SUPPORT" "$LOGS" "$CACHES"
    else
        echo "    kept your data in $SUPPORT (--uninstall --purge removes it)"
    fi
}

install_program() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: brew install python@3.11"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$PYTHON is $("$PYTHON" -V 2>&1); warmstart needs Python 3.11 or newer"
    xcode-select -p >/dev/null 2>&1 ||
        die "llama-cpp-python compiles from source: run xcode-select --install first"
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating the virtual environment $VENV"
        mkdir -p "$SUPPORT"
        "$PYTHON" -m venv "$VENV"
    fi
    pip="$VENV/bin/python -m pip --disable-pip-version-check"
    llama=""
    [ -f "$SOURCE/pyproject.toml" ] &&
        llama=$(grep -o 'llama-cpp-python==[0-9][0-9.]*' "$SOURCE/pyproject.toml" | head -n 1)
    kind=cpu
    flags=${CMAKE_ARGS:-}
    # Metal is llama.cpp's default on Apple silicon; said explicitly, so that its wheel
    # has a folder of its own in the shared cache
    if [ "$(uname -m)" = arm64 ]; then kind=metal; flags="$flags -DGGML_METAL=on"; fi
    if [ -n "$llama" ]; then
        # the wheel cache every install path shares (installers/llama_wheel.py: compiled
        # once per build flags, 10-20 min, with a progress bar)
        wheel=$(CMAKE_ARGS=$flags "$VENV/bin/python" "$HERE/../llama_wheel.py" \
            --version "${llama#*==}") || die "llama-cpp-python could not be built (see above)"
        build="$kind $llama $(basename "$wheel")"
        if [ "$(cat "$VENV/.warmstart-build" 2>/dev/null || true)" != "$build" ]; then
            $pip install --quiet --no-deps --force-reinstall "$wheel"
            echo "$build" >"$VENV/.warmstart-build"
        fi
    fi
    say "installing warmstart from $SOURCE"
    $pip install --quiet --upgrade --upgrade-strategy only-if-needed "$SOURCE[app]"
    [ -f "$VENV/.warmstart-build" ] || echo "cpu $llama" >"$VENV/.warmstart-build"
    mkdir -p "$BIN_DIR"
    ln -sfn "$VENV/bin/warmstart" "$LAUNCHER"
}

install_agent() {
    mkdir -p "$(dirname "$PLIST")" "$LOGS"
    plist >"$PLIST"
    plutil -lint "$PLIST" >/dev/null
    agent_off
    launchctl bootstrap "gui/$(id -u)" "$PLIST"
    say "the API runs at login: http://127.0.0.1:8765/v1 (log: $LOGS/api.log)"
}

case "$MODE" in uninstall) uninstall; exit 0 ;; esac
install_program
if [ "$SERVICE" = 1 ] || [ -f "$PLIST" ]; then install_agent; fi
if [ "$PULL_MODEL" = 1 ]; then "$VENV/bin/warmstart" models pull default; fi
cat <<EOF

warmstart is installed ($(cut -d' ' -f1 "$VENV/.warmstart-build") build; untested on macOS).
  command        $LAUNCHER  (add $BIN_DIR to your PATH if needed)
  program        $VENV
  models, KV cache, conversations, settings   $SUPPORT
  API agent      $( [ -f "$PLIST" ] && echo "$PLIST" || echo "not installed (--service)")
  logs           $LOGS
Try: warmstart ask "Why is the sky blue?"    Desktop app: warmstart app
EOF
