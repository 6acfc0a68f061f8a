# Shared helpers for the scenario scripts (sourced, not run).
# Every script: set -euo pipefail, one work dir under $SCEN_TMP, a cleanup
# trap that stops the daemons it started (by pid) and detaches the loop
# devices and cgroups it made.

SCEN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SCEN_OUT=${SCEN_OUT:-$SCEN_ROOT/scenarios/out}
# Images and data dirs live on a real disk (not tmpfs: cache=none needs
# O_DIRECT).
SCEN_TMP=${SCEN_TMP:-/var/tmp}
VMSAN=${VMSAN:-$SCEN_OUT/bin/vmsan}

_pids=() _mounts=() _loops=() _cgroups=() _workdirs=()

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }

# need_tools PROG:PKG ... - fail with a clear message, or install the
# Debian packages with apt-get when running as root (like `make deps`).
need_tools() {
	local missing=() pkgs=() t
	for t in "$@"; do
		command -v "${t%%:*}" >/dev/null 2>&1 || { missing+=("${t%%:*}"); pkgs+=("${t#*:}"); }
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		log "missing ${missing[*]}; installing ${pkgs[*]} with apt-get"
		DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null
	else
		die "missing tools: ${missing[*]} (Debian packages: ${pkgs[*]}); run as root to install them"
	fi
}

need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root"; }

build_vmsan() {
	mkdir -p "$SCEN_OUT/bin"
	log "building vmsan"
	(cd "$SCEN_ROOT" && go build -o "$SCEN_OUT/bin/vmsan" ./cmd/vmsan)
}

# workdir: a fresh directory in $WORKDIR (a global, not printed, so that the
# cleanup list survives: command substitution would run in a subshell).
workdir() {
	WORKDIR=$(mktemp -d "$SCEN_TMP/vmsan-scen-XXXXXX")
	_workdirs+=("$WORKDIR")
}

# loop_fs MKFS IMG MNT SIZE [mkfs args...]: sparse image, formatted, loop
# mounted. Sets LOOP_DEV.
loop_fs() {
	local mkfs=$1 img=$2 mnt=$3 size=$4; shift 4
	truncate -s "$size" "$img"
	"$mkfs" "$@" "$img" >/dev/null 2>&1 || die "$mkfs $img failed"
	LOOP_DEV=$(losetup -f --show "$img") || die "losetup failed (no loop devices?)"
	_loops+=("$LOOP_DEV")
	mkdir -p "$mnt"
	mount "$LOOP_DEV" "$mnt" || die "mount $LOOP_DEV $mnt failed"
	_mounts+=("$mnt")
}

# free_port: sets PORT to a port nobody listens on, outside the tests'
# 25000-25999 range, and not handed out before by this script (the daemons
# only bind them later, so the listen check alone could repeat a pick).
_ports=" "
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((27000 + RANDOM % 2000))
		case "$_ports" in *" $p "*) continue ;; esac
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			_ports="$_ports$p "
			PORT=$p
			return
		fi
	done
	die "no free port"
}

wait_http() { # URL TIMEOUT_S
	local i
	for i in $(seq 1 $(($2 * 10))); do curl -fs "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
	return 1
}

# metric NAME_REGEX URL: sum of the values of matching series.
metric() {
	curl -fs "$2" | awk -v re="$1" '$0 !~ /^#/ && $1 ~ re { s += $2 } END { printf "%.0f\n", s }'
}

# child CMD...: run CMD in the background and wait for it, so that a TERM
# sent to the script runs the cleanup at once (bash defers traps until a
# foreground child exits) and the cleanup stops CMD too.
child() {
	"$@" &
	local p=$!
	_pids+=("$p")
	wait "$p"
}

cleanup_all() {
	local rc=$? p m l c d
	for p in "${_pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${_pids[@]}"; do
		for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -9 "$p" 2>/dev/null || true
	done
	for m in "${_mounts[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
	for l in "${_loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
	for c in "${_cgroups[@]}"; do rmdir "$c" 2>/dev/null || true; done
	for d in "${_workdirs[@]}"; do rm -rf "$d"; done
	exit $rc
}
trap cleanup_all EXIT INT TERM

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
