# shellcheck shell=bash
# scripts/testbed.sh's jobs.
# That script documents the test bed and sources this file: functions only, which read
# and set the globals it declares.

# start_job NAME ARGS...: starts `WORKER ARGS` as one job of H*L ranks, every host's ranks
# started by `a2ad run` in its namespace, all hosts in parallel, and returns. WORKER is the
# caller's local array (bash scoping is dynamic): call it through bench_job, moe_job or a
# function of that kind. JOB_TAG names the job's logs: $LOGDIR/<JOB_TAG>.h<i>.{out,err};
# JOB_OUT is host 0's stdout. With JOB_STREAM=1 (also the caller's local) the ranks' output
# goes to this script's stdout and stderr instead, as it comes, and there are no logs.
# wait_job waits for it.
start_job() {
	JOB_NAME=$1
	shift
	JOB=$((JOB + 1))
	JOB_TAG="$JOB.${JOB_NAME//\//-}"
	local group="tb$RUN-$JOB-${JOB_NAME//\//-}" i
	JOB_OUT=$LOGDIR/$JOB_TAG.h0.out
	JOB_PIDS=()
	JOB_T0=$(now_us)
	for ((i = 0; i < HOSTS; i++)); do
		if [ "${JOB_STREAM:-0}" = 1 ]; then
			host_run "$i" "$group" "$@" &
		else
			host_run "$i" "$group" "$@" >"$LOGDIR/$JOB_TAG.h$i.out" 2>"$LOGDIR/$JOB_TAG.h$i.err" &
		fi
		JOB_PIDS[i]=$!
		PIDS+=("$!")
	done
}

# host_run I GROUP ARGS...: host I's part of start_job's job, `a2ad run` of its ranks in its
# namespace. It replaces the shell it runs in (exec), so the pid start_job keeps is the run's.
host_run() {
	local i=$1 group=$2
	shift 2
	exec "${PDEATH[@]}" ip netns exec "$(host_ns "$i")" \
		env A2A_HOST="host$i" A2A_LISTEN="$(host_ip "$i"):0" \
		"$A2AD" run -n "$LOCAL" --world "$WORLD" --rank-offset $((i * LOCAL)) \
		--nats "$NATS_URL" --group "$group" --creds "$CREDS" --bind none -- \
		"${WORKER[@]}" "$@"
}

# wait_job waits for the job start_job started. Returns 0 when every host's run exits 0, 3
# when a2ad rejected the --algo, 1 otherwise (FAILED names the hosts).
wait_job() {
	local name=$JOB_NAME tag=$JOB_TAG t0=$JOB_T0 pids=("${JOB_PIDS[@]}") st=() i
	for ((i = 0; i < HOSTS; i++)); do
		st[i]=""
	done
	# Wait for all; once one host failed the others get 5 s to notice (they fail with
	# peer lost / aborted) before they are stopped; the whole job gets --timeout.
	local remaining=$HOSTS first_fail="" failed_at=0 stopped=0 timed_out=0 cut=()
	local deadline=$((SECONDS + TIMEOUT))
	while [ "$remaining" -gt 0 ]; do
		for ((i = 0; i < HOSTS; i++)); do
			[ -z "${st[i]}" ] || continue
			kill -0 "${pids[i]}" 2>/dev/null && continue
			wait "${pids[i]}"
			st[i]=$?
			remaining=$((remaining - 1))
			if [ "${st[i]}" != 0 ] && [ -z "$first_fail" ] && [ "$stopped" = 0 ]; then
				first_fail=$i
				failed_at=$SECONDS
			fi
		done
		[ "$remaining" -gt 0 ] || break
		if [ "$stopped" = 0 ] && { [ -n "$first_fail" ] && [ $((SECONDS - failed_at)) -ge 5 ] || [ "$SECONDS" -ge "$deadline" ]; }; then
			[ -z "$first_fail" ] && timed_out=1
			stopped=$SECONDS
			for ((i = 0; i < HOSTS; i++)); do
				[ -n "${st[i]}" ] && continue
				cut[i]=1
				kill -TERM "${pids[i]}" 2>/dev/null
			done
		elif [ "$stopped" != 0 ] && [ $((SECONDS - stopped)) -ge 5 ]; then
			for ((i = 0; i < HOSTS; i++)); do
				[ -n "${st[i]}" ] || kill -KILL "${pids[i]}" 2>/dev/null
			done
		fi
		sleep 0.05
	done
	JOB_US=$(($(now_us) - t0))
	# a2ad validates --algo, bench among its flags and the library when a rank joins: every
	# rank fails at once with one of these messages.
	local rej
	if [ -n "$first_fail" ] && rej=$(grep -s -h -E 'invalid argument.*(A2A_ALGO|algorithm)|a2ad bench: --algo "' "$LOGDIR/$tag".h*.err); then
		rej=${rej%%$'\n'*}
		REJECT_MSG=${rej#\[rank *\] }
		return 3
	fi
	local failed=() hung=()
	for ((i = 0; i < HOSTS; i++)); do
		if [ -n "${cut[i]:-}" ]; then
			hung+=("host $i")
		elif [ "${st[i]}" != 0 ]; then
			failed+=("host $i ($(host_ns "$i")) exit ${st[i]}")
		fi
	done
	[ ${#failed[@]} -gt 0 ] || [ ${#hung[@]} -gt 0 ] || return 0
	local list why
	if [ "$timed_out" = 1 ]; then
		list=$(join_by ", " "${hung[@]}")
		why="$list still running after --timeout ${TIMEOUT}s (stopped)"
	else
		list=$(join_by ", " "${failed[@]}")
		why="failed: $list"
		[ ${#hung[@]} -gt 0 ] && why+="; $(join_by ", " "${hung[@]}") stopped 5s later"
	fi
	FAILED+=("$name: $why")
	warn "FAIL $name: $why"
	if [ -n "$first_fail" ] && [ -f "$LOGDIR/$tag.h$first_fail.err" ]; then
		warn "  stderr of host $first_fail ($(host_ns "$first_fail")), the first to fail:"
		tail -n 15 "$LOGDIR/$tag.h$first_fail.err" | sed 's/^/    /' >&2
	fi
	return 1
}

# run_job NAME ARGS...: start_job and wait_job.
run_job() {
	start_job "$@"
	wait_job
}

# bench_job NAME ARGS...: run_job with `a2ad bench --worker ARGS` on every rank.
bench_job() {
	local WORKER=("$A2AD" bench --worker)
	run_job "$@"
}

# moe_job NAME ARGS...: run_job with the MoE demo's ranks, `MOE --worker ARGS`.
moe_job() {
	local WORKER=("$MOE" --worker)
	run_job "$@"
}

# job_out prints the file holding host 0's stdout of the last job.
job_out() { printf '%s' "$JOB_OUT"; }

# rows prints rank 0's output of the last job's host 0 without the rank prefix.
rows() { sed -n 's/^\[rank 0\] //p' "$(job_out)"; }

# check_rows NAME NROWS: rank 0 printed NROWS rows (a positive multiple of it when NROWS ends
# in '*', as --algo all prints a row per algorithm and size), all with #wrong (the last
# column) 0.
check_rows() {
	local name=$1 want=$2 out n bad count_ok=0
	out=$(job_out)
	n=$(grep -cE "$ROW_RE" "$out")
	bad=$(grep -E "$ROW_RE" "$out" | awk '$NF != "0"' | head -n 3)
	case $want in
	*\*) [ "$n" -gt 0 ] && [ $((n % ${want%\*})) = 0 ] && count_ok=1 ;;
	*) [ "$n" = "$want" ] && count_ok=1 ;;
	esac
	if [ "$count_ok" = 0 ] || [ -n "$bad" ] || grep -q fail "$out"; then
		FAILED+=("$name: rank 0 (host 0) printed $n of $want rows, not all with #wrong 0")
		warn "FAIL $name: rank 0 (host 0, $(host_ns 0)) printed $n of $want rows, want all with #wrong 0:"
		sed 's/^/    /' "$out" >&2
		return 1
	fi
	return 0
}

# soak_start NAME ARGS...: start_job with the soak's ranks, `SOAK_BIN --worker ARGS`.
soak_start() {
	local WORKER=("$SOAK_BIN" --worker)
	start_job "$@"
}

# job_lines RE prints the lines of the last job's ranks (every host) that match RE, without
# the rank prefix a2ad run adds.
job_lines() { cat "$LOGDIR/$JOB_TAG".h*.out 2>/dev/null | grep -E "$1" | sed 's/^\[rank [0-9]*\] //'; }

# finish prints the summary line of a --run, soak or link-cut run and exits.
finish() {
	local what=$1
	cleanup
	local detail="hosts=$HOSTS ranks/host=$LOCAL $what; total $(secs $(($(now_us) - T0)))"
	if [ ${#FAILED[@]} -gt 0 ]; then
		say "FAIL $(join_by "; " "${FAILED[@]}"); $detail"
		exit 1
	fi
	say "PASS $detail"
	exit 0
}

# user_job NAME: run_job with the user's program (--run) as the ranks, their output
# streamed with a2ad run's prefixes.
user_job() {
	local WORKER=("${RUN_PROG[@]}") JOB_STREAM=1
	run_job "$@"
}

# job_alive: every host's a2ad run of the last job is still running.
job_alive() {
	local p
	for p in "${JOB_PIDS[@]}"; do
		kill -0 "$p" 2>/dev/null || return 1
	done
}
