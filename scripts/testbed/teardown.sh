# shellcheck shell=bash
# scripts/testbed.sh's teardown.
# That script documents the test bed and sources this file: functions only, which read
# and set the globals it declares.

# kill_ns_procs kills every process inside the given namespaces: SIGTERM, then SIGKILL
# after 3 s for those still there.
kill_ns_procs() {
	local ns pids=() more p
	for ns in "$@"; do
		mapfile -t more < <(ip netns pids "$ns" 2>/dev/null)
		pids+=("${more[@]}")
	done
	[ ${#pids[@]} -gt 0 ] || return 0
	kill -TERM "${pids[@]}" 2>/dev/null
	for _ in $(seq 30); do
		local alive=()
		for p in "${pids[@]}"; do
			kill -0 "$p" 2>/dev/null && alive+=("$p")
		done
		[ ${#alive[@]} -gt 0 ] || return 0
		pids=("${alive[@]}")
		sleep 0.1
	done
	kill -KILL "${pids[@]}" 2>/dev/null
	return 0
}

cleanup() {
	[ "$CLEANED" = 1 ] && return
	CLEANED=1
	local p ns
	for p in "${PIDS[@]}"; do
		kill -TERM "$p" 2>/dev/null
	done
	kill_ns_procs "${NAMESPACES[@]}"
	for p in "${PIDS[@]}"; do
		kill -KILL "$p" 2>/dev/null
		wait "$p" 2>/dev/null
	done
	for ns in "${NAMESPACES[@]}"; do
		ip netns del "$ns" 2>/dev/null || warn "could not delete namespace $ns"
	done
	if [ -n "$LOGDIR" ]; then
		if [ "$KEEP_LOGS" = 1 ]; then
			warn "logs kept in $LOGDIR"
		else
			rm -rf "$LOGDIR"
		fi
	fi
}

# shellcheck disable=SC2317 # called by the traps testbed.sh sets
on_signal() {
	warn "interrupted by SIG$1: tearing down"
	cleanup
	trap - "$1"
	exit $((128 + $2))
}

# Leftovers of earlier runs whose owner is gone (killed with SIGKILL, machine rebooted
# processes, ...): a namespace a2a-tb-<pid>-* whose <pid> is not a running testbed.sh.
owner_alive() {
	grep -qa 'testbed\.sh' "/proc/$1/cmdline" 2>/dev/null
}

# remove_leftovers deletes the namespaces and log directories of earlier runs whose owner
# is gone (owner_alive), with every process still inside them.
remove_leftovers() {
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^a2a-tb-[0-9]+-'); do
		owner=${ns#a2a-tb-}
		owner=${owner%%-*}
		[ "$owner" = "$RUN" ] && continue
		owner_alive "$owner" && continue
		kill_ns_procs "$ns"
		ip netns del "$ns" 2>/dev/null && warn "removed leftover namespace $ns (run $owner is gone)"
	done
	for dir in "${TMPDIR:-/tmp}"/a2a-tb.[0-9]*.*; do
		[ -d "$dir" ] || continue
		owner=${dir##*/a2a-tb.}
		owner=${owner%%.*}
		owner_alive "$owner" || rm -rf "$dir"
	done
}
