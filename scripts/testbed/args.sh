# shellcheck shell=bash
# scripts/testbed.sh's arguments and prerequisites.
# That script documents the test bed and sources this file: functions only, which read
# and set the globals it declares.

# parse_args ARGS...: sets the globals of the options (defaults in testbed.sh).
parse_args() {
	while [ $# -gt 0 ]; do
		opt=$1
		val=""
		case $opt in
		--*=*)
			val=${opt#*=}
			opt=${opt%%=*}
			set -- "$opt" "$val" "${@:2}"
			;;
		esac
		case $opt in
		-H | --hosts) need_arg "$opt" $#; HOSTS=$2; shift 2 ;;
		-L | --ranks-per-host) need_arg "$opt" $#; LOCAL=$2; shift 2 ;;
		--delay) need_arg "$opt" $#; DELAY=$2; shift 2 ;;
		--rate) need_arg "$opt" $#; RATE=$2; shift 2 ;;
		--a2ad) need_arg "$opt" $#; A2AD=$2; shift 2 ;;
		--moe) need_arg "$opt" $#; MOE=$2; shift 2 ;;
		--algos) need_arg "$opt" $#; ALGOS=$2; shift 2 ;;
		--bench-sizes) need_arg "$opt" $#; BENCH_SIZES=$2; shift 2 ;;
		--bench-dist) need_arg "$opt" $#; BENCH_DIST=$2; shift 2 ;;
		--bench-counts) need_arg "$opt" $#; BENCH_COUNTS=$2; shift 2 ;;
		--bench-timing) need_arg "$opt" $#; BENCH_TIMING=$2; shift 2 ;;
		--check-only) CHECK_ONLY=1; shift ;;
		--timeout) need_arg "$opt" $#; TIMEOUT=$2; shift 2 ;;
		--keep-logs) KEEP_LOGS=1; shift ;;
		--soak) need_arg "$opt" $#; SOAK=$2; shift 2 ;;
		--seed) need_arg "$opt" $#; SEED=$2; shift 2 ;;
		--link-cut) LINK_CUT=1; shift ;;
		--soak-bin) need_arg "$opt" $#; SOAK_BIN=$2; shift 2 ;;
		--run)
			shift
			[ "${1:-}" = -- ] && shift
			[ $# -gt 0 ] || die 2 "--run needs a program: --run -- PROGRAM [ARGS...]"
			RUN_PROG=("$@")
			break
			;;
		-h | --help) usage; exit 0 ;;
		*) usage >&2; die 2 "unknown argument: $opt" ;;
		esac
	done
}

# check_args validates the options and derives ALGO_LIST, soak_secs, SEED, DELAY_US,
# HALF_DELAY and RATE_BPS from them; it exits 2 on a bad one.
check_args() {
	if ! is_uint "$HOSTS" || [ "$HOSTS" -lt 1 ] || [ "$HOSTS" -gt 200 ]; then
		die 2 "-H $HOSTS: need 1..200 hosts"
	fi
	if ! is_uint "$LOCAL" || [ "$LOCAL" -lt 1 ]; then
		die 2 "-L $LOCAL: need at least one rank per host"
	fi
	if ! is_uint "$TIMEOUT" || [ "$TIMEOUT" -lt 1 ]; then
		die 2 "--timeout $TIMEOUT: seconds >= 1"
	fi
	[ -n "$ALGOS" ] || die 2 "--algos is empty"
	case $BENCH_COUNTS in
	known | matrix | nats | inband) ;;
	*) die 2 "--bench-counts $BENCH_COUNTS: known, matrix, nats or inband" ;;
	esac
	case $BENCH_TIMING in
	barrier | span) ;;
	*) die 2 "--bench-timing $BENCH_TIMING: barrier or span" ;;
	esac
	IFS=, read -r -a ALGO_LIST <<<"$ALGOS"
	if [ -n "$SOAK" ]; then
		[[ $SOAK =~ ^([0-9]+)(s|m)$ ]] || die 2 "--soak $SOAK: want N followed by s or m (e.g. 15s, 5m)"
		soak_secs=$((10#${BASH_REMATCH[1]}))
		[ "${BASH_REMATCH[2]}" = m ] && soak_secs=$((soak_secs * 60))
		# The job's limit: the soak, its last session and the leak check.
		[ "$TIMEOUT" -ge $((soak_secs + 120)) ] || TIMEOUT=$((soak_secs + 120))
		[ -n "$SEED" ] || SEED=$(((RANDOM << 30 | RANDOM << 15 | RANDOM) + 1))
		is_uint "$SEED" && [ "$SEED" -gt 0 ] || die 2 "--seed $SEED: a positive integer"
	fi
	[ -n "$SOAK" ] && [ "$LINK_CUT" = 1 ] && die 2 "--soak and --link-cut: one at a time"
	[ "$LINK_CUT" = 1 ] && [ "$HOSTS" -lt 2 ] && die 2 "--link-cut needs at least 2 hosts"
	if [ ${#RUN_PROG[@]} -gt 0 ] && { [ -n "$SOAK" ] || [ "$LINK_CUT" = 1 ]; }; then
		die 2 "--run: not with --soak or --link-cut (one at a time)"
	fi
	for a in "${ALGO_LIST[@]}"; do
		[[ $a =~ ^[a-z0-9_-]+$ ]] || die 2 "--algos: bad algorithm name '$a'"
	done

	# Delay in microseconds, halved per link end (printed with a .5 when odd).
	DELAY_US=0
	if [ -n "$DELAY" ]; then
		if [[ $DELAY =~ ^([0-9]+)(us|ms|s)$ ]]; then
			case ${BASH_REMATCH[2]} in
			us) DELAY_US=$((10#${BASH_REMATCH[1]})) ;;
			ms) DELAY_US=$((10#${BASH_REMATCH[1]} * 1000)) ;;
			s) DELAY_US=$((10#${BASH_REMATCH[1]} * 1000000)) ;;
			esac
		else
			die 2 "--delay $DELAY: want N followed by us, ms or s (e.g. 200us)"
		fi
	fi
	HALF_DELAY="$((DELAY_US / 2)).$((DELAY_US % 2 * 5))us"

	# Rate in bytes per second (tc units: bit = bits/s, bps = bytes/s), for tbf's burst.
	RATE_BPS=0
	if [ -n "$RATE" ]; then
		RATE=${RATE,,}
		if [[ $RATE =~ ^([0-9]+)([kmgt]?)(bit|bps)$ ]]; then
			n=$((10#${BASH_REMATCH[1]}))
			case ${BASH_REMATCH[2]} in
			k) n=$((n * 1000)) ;;
			m) n=$((n * 1000000)) ;;
			g) n=$((n * 1000000000)) ;;
			t) n=$((n * 1000000000000)) ;;
			esac
			[ "${BASH_REMATCH[3]}" = bit ] && n=$((n / 8))
			RATE_BPS=$n
		fi
		[ "$RATE_BPS" -gt 0 ] || die 2 "--rate $RATE: want N followed by bit, kbit, mbit, gbit (or bps, kbps, ...)"
	fi
}

# check_prerequisites needs root and iproute2 (installing it with apt-get), makes the
# binaries' paths absolute and checks them, and sets PDEATH.
check_prerequisites() {
	[ "$(id -u)" = 0 ] || die 2 "needs root for network namespaces (run with sudo)"
	if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
		warn "iproute2 missing: installing it with apt-get"
		if command -v apt-get >/dev/null 2>&1; then
			DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null 2>&1
		fi
		if ! command -v ip >/dev/null 2>&1 || ! command -v tc >/dev/null 2>&1; then
			die 2 "iproute2 (ip, tc) missing and apt-get could not install it"
		fi
	fi
	[ -n "$A2AD" ] || A2AD=$ROOT/bin/a2ad
	need_exe A2AD a2ad "run make build, or pass --a2ad PATH"
	if [ -n "$SOAK" ] || [ "$LINK_CUT" = 1 ]; then
		[ -n "$SOAK_BIN" ] || SOAK_BIN=$ROOT/bin/soak
		need_exe SOAK_BIN soak "run make build, or pass --soak-bin PATH"
	fi
	if [ ${#RUN_PROG[@]} -gt 0 ]; then
		# As a shell finds it, then absolute: the ranks start in other namespaces.
		case ${RUN_PROG[0]} in
		*/*) need_exe "RUN_PROG[0]" "--run: program" ;;
		*)
			prog=$(command -v -- "${RUN_PROG[0]}") || die 2 "--run: program ${RUN_PROG[0]} not found on PATH"
			RUN_PROG[0]=$prog
			need_exe "RUN_PROG[0]" "--run: program"
			;;
		esac
	fi
	if [ -n "$MOE" ]; then
		need_exe MOE MoE
	elif [ -x "$ROOT/bin/moe" ]; then
		MOE=$ROOT/bin/moe
	fi

	# Started processes get SIGTERM if this shell dies without running its traps (SIGKILL).
	PDEATH=()
	if [[ $(setpriv --help 2>&1) == *--pdeathsig* ]]; then
		PDEATH=(setpriv --pdeathsig TERM)
	fi
}
