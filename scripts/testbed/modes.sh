# shellcheck shell=bash
# scripts/testbed.sh's modes: your program, soak, link cut, checks, benchmark.
# That script documents the test bed and sources this file: functions only, which read
# and set the globals it declares.

# run_user_program runs --run's program as the job's ranks and exits.
run_user_program() {
	say "run: $WORLD ranks ($HOSTS hosts x $LOCAL) of ${RUN_PROG[*]}"
	if user_job run; then
		say "ok   run in $(secs "$JOB_US"): every rank exited 0"
	fi
	finish "shaping=[$SHAPING] run=[${RUN_PROG[*]}]"
}

# run_soak runs the soak across the hosts and exits.
run_soak() {
	say "soak: $WORLD ranks for $SOAK, seed $SEED (reproduce: scripts/testbed.sh -H $HOSTS -L $LOCAL --soak $SOAK --seed $SEED)"
	soak_start soak --seed "$SEED" --duration "$SOAK"
	if wait_job; then
		passed=$(job_lines 'soak: rank [0-9]+ PASS' | wc -l)
		if [ "$passed" = "$WORLD" ]; then
			say "ok   soak in $(secs "$JOB_US"): $(job_lines 'soak: session' | wc -l) sessions"
			job_lines 'soak: rank [0-9]+ PASS' | sed 's/; ops:.*//; s/^/    /'
		else
			FAILED+=("soak: $passed of $WORLD ranks printed PASS")
		fi
	fi
	finish "soak=$SOAK seed=$SEED"
}

# run_link_cut runs the link-cut test and exits.
run_link_cut() {
	CUT=$((HOSTS - 1))
	say "link cut: $WORLD ranks loop ExchangeCounts + AllToAllV + AllReduce; host $CUT's link (vh$CUT) goes down mid-operation"
	soak_start link-cut --link-cut --seed "$(((RANDOM << 15 | RANDOM) + 1))"
	# All ranks in the loop (each prints "running" after its first verified round).
	deadline=$((SECONDS + 60))
	until [ "$(job_lines 'linkcut: rank [0-9]+ running' | wc -l)" = "$WORLD" ]; do
		if ! job_alive || [ "$SECONDS" -ge "$deadline" ]; then
			FAILED+=("link cut: the ranks did not all start their loop")
			wait_job
			finish "link-cut"
		fi
		sleep 0.05
	done
	sleep 1 # well inside the loop: every rank is in some operation
	setup ip -n "$BRNS" link set "vh$CUT" down
	T_CUT=$(now_us)
	say "link of host $CUT cut at $T_CUT us"
	# Every rank must report a typed error within 3 s; 10 s is the hang limit here.
	deadline=$((SECONDS + 10))
	while [ "$(job_lines 'linkcut: rank [0-9]+ error' | wc -l)" -lt "$WORLD" ] && [ "$SECONDS" -lt "$deadline" ]; do
		sleep 0.05
	done
	# Down a second longer, so the ranks' first tries to join again meet the cut link.
	sleep 1
	setup ip -n "$BRNS" link set "vh$CUT" up
	T_UP=$(now_us)
	say "link of host $CUT back after $(secs $((T_UP - T_CUT)))"
	slowest=0
	reported=0
	while IFS= read -r line; do
		[[ $line =~ rank\ ([0-9]+)\ error\ at_us=([0-9]+)\ kind=([a-z+-]+)\ op=([a-z]+) ]] || continue
		r=${BASH_REMATCH[1]} at=${BASH_REMATCH[2]} kind=${BASH_REMATCH[3]} op=${BASH_REMATCH[4]}
		reported=$((reported + 1))
		d=$((at - T_CUT))
		[ "$d" -gt "$slowest" ] && slowest=$d
		host=$((r / LOCAL))
		say "  rank $r (host $host) in $op: $kind after $(secs "$d"): ${line#*: }"
		[ "$kind" != untyped ] || FAILED+=("link cut: rank $r got an untyped error")
		[ "$d" -le 3000000 ] || FAILED+=("link cut: rank $r detected the cut after $(secs "$d"), limit 3s")
	done < <(job_lines 'linkcut: rank [0-9]+ error' | sort -t' ' -k3n)
	[ "$reported" = "$WORLD" ] || FAILED+=("link cut: $reported of $WORLD ranks reported an error within 10s (the rest hang)")
	say "slowest detection $(secs "$slowest")"
	if wait_job; then
		joined=$(job_lines 'linkcut: rank [0-9]+ rejoined' | wc -l)
		job_lines 'linkcut: rank [0-9]+ (closed|rejoined)' | sed 's/^/    /'
		[ "$joined" = "$WORLD" ] || FAILED+=("link cut: $joined of $WORLD ranks joined again and verified")
		say "joined again and verified on all $joined ranks, $(secs $(($(now_us) - T_UP))) after the link came back"
	fi
	finish "link-cut host=$CUT slowest-detection=$(secs "$slowest")"
}

# run_checks runs the correctness jobs: AllToAllV per algorithm, AllToAll, the MoE demo.
run_checks() {
	CHECK_SIZES="0,1,1K,64K"
	N_CHECK_SIZES=4
	CHECK_ARGS=(--sizes "$CHECK_SIZES" --check --iters 20 --warmup 2)
	ACCEPTED=()
	CHECKED=()
	T1=$(now_us)
	say "correctness: AllToAllV over sizes $CHECK_SIZES (zipf:1.1) per algorithm, then AllToAll; $WORLD ranks"
	for algo in "${ALGO_LIST[@]}"; do
		name="alltoallv/$algo"
		bench_job "$name" --op alltoallv --algo "$algo" --dist zipf:1.1 "${CHECK_ARGS[@]}"
		case $? in
		3)
			REJECTED+=("$algo")
			warn "a2ad rejects algorithm '$algo': $REJECT_MSG (skipped)"
			continue
			;;
		0)
			ACCEPTED+=("$algo")
			want_rows=$N_CHECK_SIZES
			[ "$algo" = all ] && want_rows="$N_CHECK_SIZES*"
			if check_rows "$name" "$want_rows"; then
				CHECKED+=("$algo")
				say "ok   $name in $(secs "$JOB_US")"
				rows | grep -v '^#' | sed 's/^/    /'
			fi
			;;
		*) ACCEPTED+=("$algo") ;;
		esac
	done
	if [ ${#ACCEPTED[@]} -eq 0 ]; then
		die 2 "a2ad accepts none of --algos $ALGOS"
	fi
	name="alltoall"
	if bench_job "$name" --op alltoall "${CHECK_ARGS[@]}"; then
		if check_rows "$name" "$N_CHECK_SIZES"; then
			CHECKED+=("alltoall")
			say "ok   $name in $(secs "$JOB_US")"
			rows | grep -v '^#' | sed 's/^/    /'
		fi
	fi
	if [ -n "$MOE" ]; then
		name="moe"
		if moe_job "$name" -n "$WORLD" --experts $((2 * WORLD)) --tokens 48 --hidden 32 --ffn 16 --steps 3 --skew 1.1; then
			out=$(job_out)
			if grep -q "all 3 steps verified on $WORLD ranks" "$out"; then
				CHECKED+=("moe")
				say "ok   $name in $(secs "$JOB_US"): $(grep -m1 -o 'rows: .*' "$out" | sed 's/ (.*//')"
			else
				FAILED+=("$name: rank 0 did not report 3 verified steps (see $out)")
				warn "$name: rank 0 did not report 3 verified steps"
			fi
		fi
	else
		warn "MoE check skipped: no bin/moe (make build) and no --moe"
	fi
	T_CHECK=$(($(now_us) - T1))
}

# run_bench benchmarks every accepted algorithm, unless --check-only or a check failed.
run_bench() {
	BENCHED=()
	T_BENCH=0
	if [ "$CHECK_ONLY" = 0 ] && [ ${#FAILED[@]} -eq 0 ]; then
		T2=$(now_us)
		for algo in "${ACCEPTED[@]}"; do
			name="bench/$algo"
			say "benchmark: alltoallv algo=$algo hosts=$HOSTS ranks/host=$LOCAL dist=$BENCH_DIST counts=$BENCH_COUNTS timing=$BENCH_TIMING shaping: $SHAPING"
			if bench_job "$name" --op alltoallv --algo "$algo" --dist "$BENCH_DIST" --counts "$BENCH_COUNTS" \
				--timing "$BENCH_TIMING" --sizes "$BENCH_SIZES"; then
				rows
				BENCHED+=("$algo")
			fi
		done
		T_BENCH=$(($(now_us) - T2))
	elif [ "$CHECK_ONLY" = 0 ]; then
		warn "benchmark skipped: correctness failed"
	fi
}

# summarize stops the delay line, tears down, prints the summary line and exits.
summarize() {
	# The delay line prints its counters, the lateness of its sends and its CPU use on SIGTERM.
	if [ -n "$SWITCH_PID" ]; then
		kill -TERM "$SWITCH_PID" 2>/dev/null
		wait "$SWITCH_PID" 2>/dev/null
		sed -n 's/^delayswitch: \(frames\|lateness\|cpu\|last\)/delay line: \1/p' "$LOGDIR/delayswitch.log" |
			while IFS= read -r line; do say "$line"; done
	fi
	cleanup
	T_ALL=$(($(now_us) - T0))
	join() { [ $# -gt 0 ] && join_by , "$@" || echo none; }
	times="setup $(secs "$T_SETUP"), checks $(secs "$T_CHECK")"
	[ "$CHECK_ONLY" = 1 ] || times+=", bench $(secs "$T_BENCH")"
	detail="hosts=$HOSTS ranks/host=$LOCAL shaping=[$SHAPING] checked=[$(join "${CHECKED[@]}")] benchmarked=[$(join "${BENCHED[@]}")] rejected=[$(join "${REJECTED[@]}")]; $times, total $(secs "$T_ALL")"
	if [ ${#FAILED[@]} -gt 0 ]; then
		say "FAIL ${#FAILED[@]} check(s): $(join_by "; " "${FAILED[@]}"); $detail"
		exit 1
	fi
	say "PASS $detail"
	exit 0
}
