# shellcheck shell=bash
# scripts/testbed.sh's helpers.
# That script documents the test bed and sources this file: functions only, which read
# and set the globals it declares.

say() { printf 'testbed: %s\n' "$*"; }
warn() { printf 'testbed: %s\n' "$*" >&2; }
die() {
	local code=$1
	shift
	warn "$*"
	exit "$code"
}

# join_by SEP WORDS... prints the words separated by SEP.
join_by() {
	local sep=$1 out=""
	shift
	for w in "$@"; do
		out+="${out:+$sep}$w"
	done
	printf '%s' "$out"
}

# now_us is the wall clock in microseconds.
now_us() { echo "${EPOCHREALTIME/./}"; }
# secs formats a microsecond interval as seconds with two decimals.
secs() { printf '%d.%02ds' $(($1 / 1000000)) $(($1 % 1000000 / 10000)); }

# await PID LOG DEADLINE EXITED CMD...: waits until CMD succeeds, polling every 0.05 s.
# Dies with EXITED and LOG's tail if PID exits first; returns 1 once SECONDS reaches
# DEADLINE (the caller dies with its own message).
await() {
	local pid=$1 log=$2 deadline=$3 exited=$4
	shift 4
	until "$@"; do
		kill -0 "$pid" 2>/dev/null || die 2 "$exited: $(tail -n 5 "$log")"
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.05
	done
}

# need_arg OPT NARGS: OPT takes a value, so at least 2 arguments remain.
need_arg() { [ "$2" -ge 2 ] || die 2 "$1 needs a value (see --help)"; }

# is_uint S: S is a decimal number.
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

# need_exe VAR WHAT [HINT]: makes the path in VAR absolute; dies unless it is executable.
need_exe() {
	local -n exe=$1
	case $exe in /*) ;; *) exe=$PWD/$exe ;; esac
	[ -x "$exe" ] || die 2 "$2 binary $exe not found${3:+: $3}"
}

# setup runs one setup command, exiting 2 with its error output when it fails.
setup() {
	local out
	if ! out=$("$@" 2>&1); then
		die 2 "setup failed: $*: $out"
	fi
}
