#!/bin/sh
# warmstart as a home-server service under systemd, as root.
#
#   sudo installers/linux/install-server.sh --host 192.168.1.10    install and start
#   sudo installers/linux/install-server.sh --upgrade              new program; state, key, config kept
#   sudo installers/linux/install-server.sh --uninstall            remove service and program
#   sudo installers/linux/install-server.sh --uninstall --purge    also state, key, config, user
#
# Options: --host ADDR (default 0.0.0.0: every interface, with the key), --port N (8765),
# --tls-cert FILE --tls-key FILE (HTTPS; handed to the service as credentials),
# --cpu / --cuda (default: CUDA when nvcc and an NVIDIA GPU are both present),
# --no-model, --no-start, --source DIR|SPEC (default: this checkout), --python PYTHON,
# --service-user NAME (default warmstart), --root DIR (install under DIR instead of /,
# for packaging and tests: the service user is still created on this machine, since
# file owners need a real uid, and nothing is started).
# llama-cpp-python compiles once (10-20 min on 2 cores, with a progress bar) into
# root's ~/.cache/warmstart/llama-wheels/, shared with make and the other installers.
# Afterwards `sudo warmstart ...` works on the service's models, sessions and cache,
# and gives each person of the household a key: `sudo warmstart keys add NAME`.
set -eu
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin  # useradd, runuser: not on every root PATH (su)

HERE=$(cd "$(dirname "$0")" && pwd)
SOURCE=$(cd "$HERE/../.." && pwd)
PYTHON=${PYTHON:-}
PYTHON_GIVEN=0
MODE=install
PURGE=0
GPU=auto
PULL_MODEL=1
START=1
ROOT=""
SVC_USER=warmstart
HOST=""
PORT=""
TLS_CERT=""
TLS_KEY=""

die() { echo "warmstart server install: $*" >&2; exit 1; }
say() { echo "==> $*"; }
usage() {  # the comment block at the top of this file, without the '#'s
    awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --host) shift; HOST=${1:?--host needs an address} ;;
        --port) shift; PORT=${1:?--port needs a number} ;;
        --tls-cert) shift; TLS_CERT=${1:?--tls-cert needs a file} ;;
        --tls-key) shift; TLS_KEY=${1:?--tls-key needs a file} ;;
        --upgrade) MODE=upgrade ;;
        --uninstall) MODE=uninstall ;;
        --purge) PURGE=1 ;;
        --cpu) GPU=cpu ;;
        --cuda) GPU=cuda ;;
        --no-model) PULL_MODEL=0 ;;
        --no-start) START=0 ;;
        --source) shift; SOURCE=${1:?--source needs a value} ;;
        --python) shift; PYTHON=${1:?--python needs a value}; PYTHON_GIVEN=1 ;;
        --service-user) shift; SVC_USER=${1:?--service-user needs a name} ;;
        --root) shift; ROOT=${1:?--root needs a directory}; START=0 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
    shift
done
[ "$(id -u)" -eq 0 ] || die "run me as root (sudo); for one desktop user use installers/linux/install.sh"
[ "$PURGE" = 0 ] || [ "$MODE" = uninstall ] || die "--purge goes with --uninstall"
[ -z "$TLS_CERT$TLS_KEY" ] || { [ -n "$TLS_CERT" ] && [ -n "$TLS_KEY" ]; } ||
    die "--tls-cert and --tls-key go together"
case "$ROOT" in ""|/*) ;; *) ROOT=$(cd "$ROOT" && pwd) ;; esac

# Paths as the service sees them; every file operation prefixes them with $ROOT.
PREFIX=/opt/warmstart
VENV=$PREFIX/venv
CONF_DIR=/etc/warmstart
CONF=$CONF_DIR/warmstart.toml
KEY=$CONF_DIR/api-key
STATE=/var/lib/warmstart
UNIT=/etc/systemd/system/warmstart.service
WRAPPER=/usr/local/bin/warmstart  # the admin's command, on the service's data and key
WRAPPER_MARK="# Installed by warmstart's installers/linux/install-server.sh"

systemd_live() { [ -z "$ROOT" ] && [ -d /run/systemd/system ] && [ "$START" = 1 ]; }

# The pids of processes that run the venv's Python (the service, a `warmstart serve`
# or `chat` started by hand), whoever runs them.
running_pids() {
    for proc in /proc/[0-9]*; do
        cmd=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || continue
        case "$cmd" in "$ROOT$VENV"/bin/*) echo "${proc#/proc/}" ;; esac
    done
}

# Before anything is removed: what runs from the venv is stopped, or named (and then
# nothing is removed).
stop_running() {
    pids=$(running_pids)
    [ -n "$pids" ] || return 0
    say "stopping what runs from $ROOT$VENV:"
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
    say "removing the warmstart service and program"
    if systemd_live; then
        systemctl disable --now warmstart.service >/dev/null 2>&1 || true
    fi
    stop_running
    if grep -q "^$WRAPPER_MARK" "$ROOT$WRAPPER" 2>/dev/null; then
        rm -f "$ROOT$WRAPPER"
        echo "    removed $ROOT$WRAPPER"
    fi
    if [ -f "$ROOT$UNIT" ]; then rm -f "$ROOT$UNIT"; echo "    removed $ROOT$UNIT"; fi
    if systemd_live; then systemctl daemon-reload; fi
    if [ -d "$ROOT$PREFIX" ]; then rm -rf "$ROOT$PREFIX"; echo "    removed $ROOT$PREFIX"; fi
    if [ "$PURGE" = 1 ]; then
        for dir in "$ROOT$STATE" "$ROOT$CONF_DIR"; do
            if [ -d "$dir" ]; then rm -rf "$dir"; echo "    removed $dir"; fi
        done
        if id "$SVC_USER" >/dev/null 2>&1; then
            userdel "$SVC_USER" && echo "    removed the system user $SVC_USER"
        fi
    else
        echo "    kept $ROOT$STATE (models, KV cache, sessions), $ROOT$CONF_DIR (config, API key)"
        echo "    and the user $SVC_USER: --uninstall --purge removes them"
    fi
}

want_cuda() {
    case "$GPU" in cpu) return 1 ;; cuda) return 0 ;; esac
    command -v nvcc >/dev/null 2>&1 && has_nvidia_gpu
}

has_nvidia_gpu() {
    [ -e /dev/nvidia0 ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
}

create_user() {
    if id "$SVC_USER" >/dev/null 2>&1; then return 0; fi
    nologin=$(command -v nologin || echo /usr/sbin/nologin)
    useradd --system --user-group --home-dir "$STATE" --no-create-home \
        --shell "$nologin" --comment "warmstart API" "$SVC_USER"
    say "created the system user $SVC_USER"
}

create_dirs() {
    install -d -m 755 "$ROOT$PREFIX" "$ROOT$CONF_DIR" "$ROOT$(dirname "$UNIT")"
    # systemd's StateDirectory= makes it too, but the model is pulled into it now
    install -d -m 700 -o "$SVC_USER" -g "$SVC_USER" "$ROOT$STATE"
}

# True when the service user can run PYTHON (3.11+, with venv): a venv links to its
# base interpreter, and one under /root (pyenv, a home-made build) is closed to it.
service_can_run() {
    (cd / && runuser -u "$SVC_USER" -- "$1" -c \
        'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))') >/dev/null 2>&1
}

# The Python the venv is made from: --python as given, else the first one the service
# user can run, the system's before the one first on root's PATH (pyenv's, say).
pick_python() {
    if [ "$PYTHON_GIVEN" = 1 ]; then
        service_can_run "$PYTHON" || die "the user $SVC_USER cannot run $PYTHON (3.11 or newer," \
            "with venv; is it under /root?): leave out --python, or give e.g. /usr/bin/python3"
        return 0
    fi
    first=$(command -v python3 || true)
    for candidate in /usr/bin/python3 /usr/local/bin/python3 /usr/bin/python3.13 \
        /usr/bin/python3.12 /usr/bin/python3.11 "$first"; do
        if [ -n "$candidate" ] && service_can_run "$candidate"; then
            PYTHON=$candidate
            if [ -n "$first" ] && [ "$first" != "$candidate" ] && ! service_can_run "$first"; then
                say "using $PYTHON: the user $SVC_USER cannot run $first"
            fi
            return 0
        fi
    done
    die "no Python 3.11+ with venv that the user $SVC_USER can run (Debian/Ubuntu:" \
        "apt install python3 python3-venv; or --python PATH)"
}

# A venv the service user cannot run (a failed or older run made it from a Python
# under /root) is made again, not kept.
make_venv() {
    if [ -e "$ROOT$VENV" ] && ! service_can_run "$ROOT$VENV/bin/python"; then
        say "recreating $ROOT$VENV: the user $SVC_USER cannot run it"
        rm -rf "$ROOT$VENV"
    fi
    [ ! -x "$ROOT$VENV/bin/python" ] || return 0
    say "creating the virtual environment $ROOT$VENV with $PYTHON"
    if ! "$PYTHON" -m venv "$ROOT$VENV"; then
        rm -rf "$ROOT$VENV"
        die "cannot create a venv with $PYTHON: install python3-venv"
    fi
    if ! service_can_run "$ROOT$VENV/bin/python"; then
        rm -rf "$ROOT$VENV"
        die "the user $SVC_USER cannot run a venv made from $PYTHON: give --python /usr/bin/python3"
    fi
}

install_program() {
    pick_python
    make_venv
    pip="$ROOT$VENV/bin/python -m pip --disable-pip-version-check"
    llama=""
    [ -f "$SOURCE/pyproject.toml" ] &&
        llama=$(grep -o 'llama-cpp-python==[0-9][0-9.]*' "$SOURCE/pyproject.toml" | head -n 1)
    kind=cpu
    flags=${CMAKE_ARGS:-}
    if want_cuda; then kind=cuda; flags="$flags -DGGML_CUDA=on"; fi
    if [ -n "$llama" ]; then
        # the wheel cache every install path shares (compiled once per build flags, with
        # a progress bar): root's ~/.cache/warmstart/llama-wheels
        wheel=$(CMAKE_ARGS=$flags "$ROOT$VENV/bin/python" "$HERE/../llama_wheel.py" \
            --version "${llama#*==}") || die "llama-cpp-python could not be built (see above)"
        build="$kind $llama $(basename "$wheel")"
        if [ "$(cat "$ROOT$VENV/.warmstart-build" 2>/dev/null || true)" != "$build" ]; then
            $pip install --quiet --no-deps --force-reinstall "$wheel"
            echo "$build" >"$ROOT$VENV/.warmstart-build"
        fi
    fi
    say "installing warmstart from $SOURCE into $ROOT$VENV"
    $pip install --quiet --upgrade --upgrade-strategy only-if-needed "$SOURCE"
    [ -f "$ROOT$VENV/.warmstart-build" ] || echo "cpu $llama" >"$ROOT$VENV/.warmstart-build"
}

# `warmstart` for the admin (sudo warmstart models pull NAME): the service's config,
# data and key, run as the service user so that what it writes stays the service's.
write_wrapper() {
    if [ -e "$ROOT$WRAPPER" ] && ! grep -q "^$WRAPPER_MARK" "$ROOT$WRAPPER"; then
        echo "    kept $ROOT$WRAPPER: it is not ours (the service's command: $VENV/bin/warmstart)"
        return 0
    fi
    install -d -m 755 "$ROOT$(dirname "$WRAPPER")"
    cat >"$ROOT$WRAPPER.tmp" <<EOF
#!/bin/sh
$WRAPPER_MARK; removed by --uninstall.
# warmstart on the service's data ($STATE), config and API key, as the user $SVC_USER.
PATH=\$PATH:/usr/sbin:/sbin
if [ "\$(id -u)" -ne 0 ]; then
    echo "warmstart: this is the server's command, for root: sudo warmstart \$*" >&2
    exit 1
fi
key=\$(cat $KEY) || exit 1
# The key goes into the environment of a process of $SVC_USER, who holds it anyway.
exec runuser -u $SVC_USER -- env WARMSTART_CONFIG=$CONF WARMSTART_DATA_DIR=$STATE \\
    HOME=$STATE WARMSTART_API_KEY="\$key" $VENV/bin/warmstart "\$@"
EOF
    chmod 755 "$ROOT$WRAPPER.tmp"
    mv "$ROOT$WRAPPER.tmp" "$ROOT$WRAPPER"
    say "wrote the admin's command $ROOT$WRAPPER (sudo warmstart ...)"
}

write_key() {
    if [ -s "$ROOT$KEY" ]; then
        echo "    kept the API key $ROOT$KEY"
    else
        (umask 077 && "$ROOT$VENV/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$ROOT$KEY")
        say "generated an API key into $ROOT$KEY (root only)"
    fi
    chown root:root "$ROOT$KEY"
    chmod 600 "$ROOT$KEY"
}

write_config() {
    if [ -f "$ROOT$CONF" ] && [ -z "$HOST$PORT" ]; then
        echo "    kept the configuration $ROOT$CONF"
        return 0
    fi
    old_host=$(sed -n 's/^host = "\(.*\)"$/\1/p' "$ROOT$CONF" 2>/dev/null || true)
    old_port=$(sed -n 's/^port = \([0-9]*\)$/\1/p' "$ROOT$CONF" 2>/dev/null || true)
    host=${HOST:-${old_host:-0.0.0.0}}
    port=${PORT:-${old_port:-8765}}
    cat >"$ROOT$CONF.tmp" <<EOF
# warmstart server settings; every setting of \`warmstart serve --help\` can go here.
# After a change: systemctl restart warmstart
# The API key is not here: it is $KEY (root only), handed to the service by systemd.
host = "$host"
port = $port
EOF
    chmod 644 "$ROOT$CONF.tmp"
    mv "$ROOT$CONF.tmp" "$ROOT$CONF"
    say "wrote $ROOT$CONF (host $host, port $port)"
}

capability_lines() {  # none at all, unless the port needs binding below 1024
    port=$(sed -n 's/^port = \([0-9]*\)$/\1/p' "$ROOT$CONF")
    if [ "${port:-8765}" -lt 1024 ]; then
        echo "CapabilityBoundingSet=CAP_NET_BIND_SERVICE"
        echo "AmbientCapabilities=CAP_NET_BIND_SERVICE"
    else
        echo "CapabilityBoundingSet="
    fi
}

device_lines() {
    if has_nvidia_gpu; then
        cat <<EOF
# An NVIDIA GPU was found at install: only its devices are reachable
# (nvidia-frontend covers /dev/nvidia0..N, nvidiactl and nvidia-modeset).
DevicePolicy=closed
DeviceAllow=char-nvidia-frontend rw
DeviceAllow=char-nvidia-uvm rw
DeviceAllow=char-nvidia-caps rw
EOF
    else
        echo "PrivateDevices=yes"
    fi
}

write_unit() {
    if [ -z "$TLS_CERT" ] && [ -f "$ROOT$UNIT" ]; then  # an upgrade keeps the TLS files
        TLS_CERT=$(sed -n 's/^LoadCredential=tls-cert://p' "$ROOT$UNIT")
        TLS_KEY=$(sed -n 's/^LoadCredential=tls-key://p' "$ROOT$UNIT")
    fi
    exec_start="$VENV/bin/warmstart serve"
    tls_creds=""
    if [ -n "$TLS_CERT" ]; then
        # As credentials, the files need not be readable by the service user.
        exec_start="$exec_start --tls-cert %d/tls-cert --tls-key %d/tls-key"
        tls_creds="LoadCredential=tls-cert:$TLS_CERT
LoadCredential=tls-key:$TLS_KEY"
    fi
    cat >"$ROOT$UNIT.tmp" <<EOF
# Installed by warmstart's installers/linux/install-server.sh; removed by --uninstall.
[Unit]
Description=warmstart API (OpenAI-compatible, tiered KV cache)
After=network-online.target
Wants=network-online.target
StartLimitIntervalSec=600
StartLimitBurst=5

[Service]
# READY=1 (sd_notify) only once the model is loaded and /health answers.
Type=notify
NotifyAccess=main
ExecStart=$exec_start
User=$SVC_USER
Group=$SVC_USER
Environment=WARMSTART_CONFIG=$CONF
Environment=WARMSTART_DATA_DIR=$STATE
Environment=HOME=$STATE
# The key reaches the server as \$CREDENTIALS_DIRECTORY/warmstart-api-key, never argv or env.
LoadCredential=warmstart-api-key:$KEY
$tls_creds
StateDirectory=warmstart
StateDirectoryMode=0700
# A bounded retry, not a loop: an address that is gone (a DHCP lease, a fixed --host
# that left) fails at once with one line, "host: ... is not an address of this
# machine"; five tries in ten minutes, then the unit stays failed (systemctl status).
Restart=on-failure
RestartSec=15
TimeoutStartSec=600
UMask=0077

NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ReadWritePaths=$STATE
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
LockPersonality=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
SystemCallArchitectures=native
$(capability_lines)
$(device_lines)

[Install]
WantedBy=multi-user.target
EOF
    chmod 644 "$ROOT$UNIT.tmp"
    mv "$ROOT$UNIT.tmp" "$ROOT$UNIT"
    say "wrote the unit $ROOT$UNIT"
}

pull_model() {
    [ "$PULL_MODEL" = 1 ] || return 0
    say "pulling the default model into $ROOT$STATE/models"
    WARMSTART_CONFIG="$ROOT$CONF" "$ROOT$VENV/bin/warmstart" models pull default \
        --data-dir "$ROOT$STATE" >/dev/null
    chown -R "$SVC_USER:$SVC_USER" "$ROOT$STATE"
}

start_service() {
    if systemd_live; then
        systemctl daemon-reload
        systemctl enable warmstart.service >/dev/null 2>&1
        say "starting warmstart (it reports ready once the model answers)"
        systemctl restart warmstart.service ||
            die "the service did not start: journalctl -u warmstart -e"
    else
        echo "    not started (no systemd here, or --root/--no-start): systemctl enable --now warmstart"
    fi
}

summary() {
    host=$(sed -n 's/^host = "\(.*\)"$/\1/p' "$ROOT$CONF")
    port=$(sed -n 's/^port = \([0-9]*\)$/\1/p' "$ROOT$CONF")
    shown=$host
    case "$host" in
        0.0.0.0|::)
            # every interface: this machine's first address, unless --root installs for
            # another machine, whose address this one cannot know
            shown=SERVER-ADDRESS
            [ -n "$ROOT" ] || shown=$(hostname -I 2>/dev/null | awk '{print $1}')
            ;;
    esac
    scheme=http
    grep -q -- '--tls-cert' "$ROOT$UNIT" && scheme=https
    url="$scheme://${shown:-$host}:$port/v1"
    serves="serves $url"
    systemd_live || serves="will serve $url once started"
    cat <<EOF

warmstart $serves  (OpenAI-compatible; model "default")
  program     $ROOT$PREFIX  ($(cut -d' ' -f1 "$ROOT$VENV/.warmstart-build" 2>/dev/null || echo cpu) build)
  command     $ROOT$WRAPPER  (sudo warmstart ...: the service's models, sessions, cache)
  state       $ROOT$STATE  (models, KV cache, sessions; owner $SVC_USER, 0700)
  config      $ROOT$CONF
  API key     $ROOT$KEY  (root only; the service gets it through LoadCredential=)
  unit        $ROOT$UNIT
  logs        journalctl -u warmstart

Try it:
  curl -H "Authorization: Bearer \$(sudo cat $KEY)" $url/models
Another model for the service (a request that names it loads it):
  sudo warmstart models list --available
  sudo warmstart models pull NAME
A key for each person (their conversations and cache are theirs; no restart needed):
  sudo warmstart keys add NAME      # prints the key once
  sudo warmstart keys list | remove NAME
EOF
}

case "$MODE" in
    uninstall) uninstall; exit 0 ;;
    upgrade) [ -x "$ROOT$VENV/bin/python" ] || say "nothing installed yet: installing" ;;
esac
create_user
create_dirs
install_program
write_key
write_config
write_unit
write_wrapper
pull_model
start_service
summary
