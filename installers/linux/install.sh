#!/bin/sh
# warmstart for one Linux desktop user: no root needed.
#
#   installers/linux/install.sh              install (or repair: running it again is safe)
#   installers/linux/install.sh --service    also run the local API at login (systemd --user)
#   installers/linux/install.sh --upgrade    new program; models, caches, conversations kept
#   installers/linux/install.sh --uninstall  remove the program; your data stays
#   installers/linux/install.sh --uninstall --purge   remove everything, data included
#
# Other options: --cpu / --cuda (default: CUDA when nvcc and an NVIDIA GPU are both
# present), --no-model (skip pulling the default model), --source DIR|SPEC (what to
# install; default: the checkout this script lives in), --python PYTHON.
# llama-cpp-python compiles once (10-20 min on 2 cores, with a progress bar) into
# ~/.cache/warmstart/llama-wheels/, shared with make and the other installers.
# pip's own environment variables (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_CACHE_DIR...)
# apply as usual.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
SOURCE=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-python3}
MODE=install
SERVICE=0
PURGE=0
GPU=auto
PULL_MODEL=1

die() { echo "warmstart install: $*" >&2; exit 1; }
say() { echo "==> $*"; }
usage() {  # the comment block at the top of this file, without the '#'s
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --service) SERVICE=1 ;;
        --upgrade) MODE=upgrade ;;
        --uninstall) MODE=uninstall ;;
        --purge) PURGE=1 ;;
        --cpu) GPU=cpu ;;
        --cuda) GPU=cuda ;;
        --no-model) PULL_MODEL=0 ;;
        --source) shift; SOURCE=${1:?--source needs a value} ;;
        --python) shift; PYTHON=${1:?--python needs a value} ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done
[ "$PURGE" = 0 ] || [ "$MODE" = uninstall ] || die "--purge goes with --uninstall"
[ "$(id -u)" -ne 0 ] || echo "warmstart install: warning: running as root installs for root only;" \
    "for a server use installers/linux/install-server.sh" >&2

# Where everything lives: the XDG base directories, as warmstart itself (platformdirs) reads them.
: "${HOME:?HOME is not set}"
DATA_HOME=${XDG_DATA_HOME:-$HOME/.local/share}
CONFIG_HOME=${XDG_CONFIG_HOME:-$HOME/.config}
CACHE_HOME=${XDG_CACHE_HOME:-$HOME/.cache}
STATE_HOME=${XDG_STATE_HOME:-$HOME/.local/state}
DATA_DIR=$DATA_HOME/warmstart           # models, KV cache, sessions, the app's conversations
VENV=$DATA_DIR/venv                     # the program (removed by --uninstall)
BIN_DIR=$HOME/.local/bin
LAUNCHER=$BIN_DIR/warmstart
DESKTOP_FILE=$DATA_HOME/applications/warmstart.desktop
ICON_DIR=$DATA_HOME/icons/hicolor
ICONS="scalable/apps/warmstart.svg 256x256/apps/warmstart.png 64x64/apps/warmstart.png"
UNIT=$CONFIG_HOME/systemd/user/warmstart.service

user_systemd() {  # true when a systemd --user instance answers (not in containers or CI)
    command -v systemctl >/dev/null 2>&1 && systemctl --user show-environment >/dev/null 2>&1
}

# Removes DIR and its parents while they are empty, never going above $HOME.
prune() {
    dir=$1
    while [ "$dir" != "$HOME" ] && [ "$dir" != / ] && [ -d "$dir" ]; do
        rmdir "$dir" 2>/dev/null || return 0
        dir=$(dirname "$dir")
    done
}

remove_file() {
    if [ -e "$1" ] || [ -L "$1" ]; then
        rm -f "$1"
        echo "    removed $1"
    fi
    prune "$(dirname "$1")"
}

# The pids of this user's processes that run the venv's Python: the app, a server,
# a chat (the launcher's shebang is the venv's python, so its command line starts so).
running_pids() {
    for proc in /proc/[0-9]*; do
        [ -O "$proc" ] || continue
        cmd=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || continue
        case "$cmd" in "$VENV"/bin/*) echo "${proc#/proc/}" ;; esac
    done
}

# Stops what runs from the venv before it goes (a running app would lose its files
# under it); says what still runs, and removes nothing, if they do not stop.
stop_running() {
    pids=$(running_pids)
    [ -n "$pids" ] || return 0
    say "stopping what runs from $VENV:"
    for pid in $pids; do echo "    $pid $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)"; done
    # shellcheck disable=SC2086  # one pid per word
    kill -TERM $pids 2>/dev/null || true
    tries=0
    while [ -n "$(running_pids)" ] && [ "$tries" -lt 30 ]; do sleep 0.5; tries=$((tries + 1)); done
    left=$(running_pids)
    [ -z "$left" ] || die "still running after 15 s: $(echo "$left" | tr '\n' ' ')(stop them and" \
        "rerun --uninstall; nothing was removed)"
}

uninstall() {
    say "removing warmstart (program, launcher, menu entry, icons, service)"
    if [ -f "$UNIT" ] && user_systemd; then
        systemctl --user disable --now warmstart.service >/dev/null 2>&1 || true
    fi
    stop_running
    remove_file "$UNIT"
    user_systemd && systemctl --user daemon-reload >/dev/null 2>&1 || true
    if [ -L "$LAUNCHER" ] || [ -e "$LAUNCHER" ]; then
        case "$(readlink "$LAUNCHER" 2>/dev/null || true)" in
            "$VENV"/*) remove_file "$LAUNCHER" ;;
            *) echo "    kept $LAUNCHER: it is not ours" ;;
        esac
    fi
    remove_file "$DESKTOP_FILE"
    for icon in $ICONS; do remove_file "$ICON_DIR/$icon"; done
    if [ -d "$VENV" ]; then rm -rf "$VENV"; echo "    removed $VENV"; fi
    if [ "$PURGE" = 1 ]; then
        say "purging your warmstart data (models, KV cache, conversations, settings)"
        for dir in "$DATA_DIR" "$CONFIG_HOME/warmstart" "$CACHE_HOME/warmstart" \
            "$STATE_HOME/warmstart"; do
            if [ -d "$dir" ]; then rm -rf "$dir"; echo "    removed $dir"; fi
            prune "$(dirname "$dir")"
        done
    else
        prune "$DATA_DIR"
        [ -d "$DATA_DIR" ] && echo "    kept your data in $DATA_DIR (--uninstall --purge removes it)"
        [ -d "$CONFIG_HOME/warmstart" ] && echo "    kept your settings in $CONFIG_HOME/warmstart"
        [ -d "$CACHE_HOME/warmstart/llama-wheels" ] && echo "    kept the compiled" \
            "llama-cpp-python in $CACHE_HOME/warmstart/llama-wheels (make and the installers share it)"
    fi
    return 0
}

check_python() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found: install Python 3.11 or newer"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        die "$PYTHON is $("$PYTHON" -V 2>&1); warmstart needs Python 3.11 or newer"
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null ||
        die "$PYTHON cannot create virtual environments: install python3-venv (Debian/Ubuntu)"
    if ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
        echo "warmstart install: warning: no C++ compiler found; llama-cpp-python builds from" \
            "source unless pip has its wheel cached (Debian/Ubuntu: apt install build-essential)" >&2
    fi
}

want_cuda() {
    case "$GPU" in
        cpu) return 1 ;;
        cuda) return 0 ;;
    esac
    # nvcc alone is not enough: a CUDA build on a machine without an NVIDIA GPU and
    # driver fails to load, so both must be there.
    command -v nvcc >/dev/null 2>&1 || return 1
    [ -e /dev/nvidia0 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
}

llama_requirement() {  # the exact llama-cpp-python pin of the checkout, if we can read it
    if [ -f "$SOURCE/pyproject.toml" ]; then
        grep -o 'llama-cpp-python==[0-9][0-9.]*' "$SOURCE/pyproject.toml" | head -n 1
    fi
}

install_program() {
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c '' 2>/dev/null; then
        say "creating the virtual environment $VENV"
        rm -rf "$VENV"
        mkdir -p "$DATA_DIR"
        "$PYTHON" -m venv "$VENV"
    fi
    pip="$VENV/bin/python -m pip"
    llama=$(llama_requirement)
    kind=cpu
    flags=${CMAKE_ARGS:-}
    if want_cuda; then
        # Intel AMX CPUs need nothing here: the runtime turns off ggml's AMX buffer
        # type itself (it dies with SIGILL in some VMs).
        kind=cuda
        flags="$flags -DGGML_CUDA=on"
    else
        say "llama.cpp builds for the CPU (use --cuda to force a CUDA build)"
    fi
    if [ -n "$llama" ]; then
        install_llama "$kind" "$llama" "$flags"
    else
        say "no llama-cpp-python pin in $SOURCE: pip builds it (10-20 min on 2 cores)"
    fi
    say "installing warmstart from $SOURCE"
    # --upgrade on the named package only: dependencies move only when they must
    $pip install --disable-pip-version-check --quiet --upgrade \
        --upgrade-strategy only-if-needed "$SOURCE[app]"
    [ -f "$VENV/.warmstart-build" ] || echo "cpu $llama" >"$VENV/.warmstart-build"
}

# llama-cpp-python from the wheel cache every install path shares (installers/
# llama_wheel.py: compiled once per build flags, with a progress bar), installed
# again only when the build changed.
install_llama() {
    wheel=$(CMAKE_ARGS=$3 "$VENV/bin/python" "$HERE/../llama_wheel.py" --version "${2#*==}") ||
        die "llama-cpp-python could not be built (see above)"
    build="$1 $2 $(basename "$wheel")"
    [ "$(cat "$VENV/.warmstart-build" 2>/dev/null || true)" != "$build" ] || return 0
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps \
        --force-reinstall "$wheel"
    echo "$build" >"$VENV/.warmstart-build"
}

install_launcher() {
    mkdir -p "$BIN_DIR"
    ln -sfn "$VENV/bin/warmstart" "$LAUNCHER"
}

install_desktop_entry() {
    template="$HERE/../../assets/warmstart.desktop.in"
    assets="$HERE/../../assets/icons"
    [ -f "$template" ] || template=""
    if [ -z "$template" ]; then
        echo "warmstart install: no assets/ next to the installer: no menu entry" >&2
        return 0
    fi
    exec_path=$LAUNCHER
    case "$exec_path" in *" "*) exec_path="\"$exec_path\"" ;; esac  # the spec's quoting
    mkdir -p "$(dirname "$DESKTOP_FILE")"
    sed -e "s|@EXEC@|$exec_path|" -e "s|@ICON@|warmstart|" "$template" >"$DESKTOP_FILE.tmp"
    mv "$DESKTOP_FILE.tmp" "$DESKTOP_FILE"
    if command -v desktop-file-validate >/dev/null 2>&1; then
        desktop-file-validate "$DESKTOP_FILE" || echo "warmstart install: warning: the menu entry" \
            "did not validate" >&2
    fi
    install -D -m 644 "$assets/warmstart.svg" "$ICON_DIR/scalable/apps/warmstart.svg"
    install -D -m 644 "$assets/warmstart-256.png" "$ICON_DIR/256x256/apps/warmstart.png"
    install -D -m 644 "$assets/warmstart-64.png" "$ICON_DIR/64x64/apps/warmstart.png"
}

install_service() {
    mkdir -p "$(dirname "$UNIT")"
    cat >"$UNIT" <<EOF
# Installed by warmstart's installers/linux/install.sh; removed by --uninstall.
[Unit]
Description=warmstart local API (OpenAI-compatible, on 127.0.0.1:8765)
# a bounded retry: five failed starts in ten minutes, then it stays failed
StartLimitIntervalSec=600
StartLimitBurst=5

[Service]
# Ready (sd_notify) once the model is loaded and /health answers.
Type=notify
ExecStart=$VENV/bin/warmstart serve
Restart=on-failure
RestartSec=15
TimeoutStartSec=600

[Install]
WantedBy=default.target
EOF
    if user_systemd; then
        systemctl --user daemon-reload
        systemctl --user enable warmstart.service >/dev/null 2>&1
        systemctl --user restart warmstart.service || echo "warmstart install: warning: the" \
            "service did not start; see: journalctl --user -u warmstart" >&2
    else
        echo "warmstart install: no systemd --user session here; at your next login run:" \
            "systemctl --user enable --now warmstart.service" >&2
    fi
}

pull_model() {
    [ "$PULL_MODEL" = 1 ] || return 0
    say "pulling the default model (SmolLM2-135M-Instruct, 98 MB; kept across upgrades)"
    "$VENV/bin/warmstart" models pull default
}

summary() {
    path_note=""
    case ":$PATH:" in *":$BIN_DIR:"*) ;; *) path_note="  (add $BIN_DIR to your PATH)" ;; esac
    service_line="not installed (--service adds it)"
    [ -f "$UNIT" ] && service_line="$UNIT  (journalctl --user -u warmstart)"
    cat <<EOF

warmstart is installed ($(cut -d' ' -f1 "$VENV/.warmstart-build" 2>/dev/null || echo cpu) build).
  command        $LAUNCHER$path_note
  program        $VENV
  models         $DATA_DIR/models
  KV cache       $DATA_DIR/cache
  conversations  $DATA_DIR (sessions; the app's in $DATA_DIR/app)
  settings       $CONFIG_HOME/warmstart/warmstart.toml  (optional; warmstart serve --help lists them)
  menu entry     $DESKTOP_FILE
  icons          $ICON_DIR/{scalable,256x256,64x64}/apps/
  API service    $service_line
  logs           the terminal; the service's in the user journal

Try:  warmstart ask "Why is the sky blue?"     or open "warmstart" from your menu.
Upgrade: $0 --upgrade    Uninstall: $0 --uninstall [--purge]
EOF
}

case "$MODE" in
    uninstall)
        uninstall
        exit 0
        ;;
    upgrade)
        [ -x "$VENV/bin/python" ] || say "nothing installed yet: installing"
        ;;
esac
check_python
install_program
install_launcher
install_desktop_entry
if [ "$SERVICE" = 1 ] || [ -f "$UNIT" ]; then install_service; fi  # an upgrade keeps the service
pull_model
summary
