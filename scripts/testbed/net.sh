# shellcheck shell=bash
# scripts/testbed.sh's namespaces, links and control plane.
# That script documents the test bed and sources this file: functions only, which read
# and set the globals it declares.

# host_ns I and host_ip I: host I's namespace and address.
host_ns() { echo "$PFX-h$1"; }
host_ip() { echo "$NET.$(($1 + 1))"; }

# shape puts the link emulation on one end of a host's link: shape NS DEV.
shape() {
	local ns=$1 dev=$2
	[ -n "$DELAY$RATE" ] || return 0
	if [ "$USE_NETEM" = 1 ]; then
		local args=(netem)
		[ -n "$DELAY" ] && args+=(delay "$HALF_DELAY")
		[ -n "$RATE" ] && args+=(rate "$RATE")
		setup tc -n "$ns" qdisc replace dev "$dev" root "${args[@]}"
		return 0
	fi
	# Without netem the delay is the delay line's (USER_DELAY); tbf shapes the rate:
	# burst of 1 ms at the rate (at least 64 KiB so one GSO packet fits).
	[ -n "$RATE" ] || return 0
	local burst=$((RATE_BPS / 1000))
	[ "$burst" -ge 65536 ] || burst=65536
	setup tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$RATE" burst "$burst" latency 100ms
}

# make_network makes the bridge namespace, one namespace per host linked to it, the link
# shaping of --delay and --rate, and the user-space delay line when the kernel lacks netem.
make_network() {
	setup ip netns add "$BRNS"
	NAMESPACES+=("$BRNS")
	setup ip -n "$BRNS" link set lo up
	setup ip -n "$BRNS" link add br0 type bridge
	setup ip -n "$BRNS" link set br0 up

	# netem shapes when the kernel has it (probed on br0, which carries no shaping itself);
	# without it --delay takes the user-space delay line instead of the bridge and --rate
	# falls back to tbf.
	USE_NETEM=0
	USER_DELAY=0
	if [ -n "$DELAY$RATE" ]; then
		modprobe sch_netem >/dev/null 2>&1 # built in, or no modules at all: the probe decides
		if tc -n "$BRNS" qdisc replace dev br0 root netem delay 1us >/dev/null 2>&1; then
			USE_NETEM=1
			setup tc -n "$BRNS" qdisc del dev br0 root
		else
			[ -n "$RATE" ] && warn "this kernel lacks tc netem: shaping --rate $RATE with tbf"
			[ -n "$DELAY" ] && USER_DELAY=1
		fi
	fi
	SWITCH=""
	SWITCH_PID=""
	if [ "$USER_DELAY" = 1 ] && [ -x "$ROOT/bin/delayswitch" ]; then
		SWITCH=$ROOT/bin/delayswitch # make build
	elif [ "$USER_DELAY" = 1 ]; then
		GO=${GO:-go}
		command -v "$GO" >/dev/null 2>&1 ||
			die 2 "--delay: this kernel lacks tc netem (CONFIG_NET_SCH_NETEM / module sch_netem), there is no bin/delayswitch (make build) and no go ($GO) to build the user-space delay line"
		SWITCH=$LOGDIR/delayswitch
		if ! out=$(cd "$ROOT" && "$GO" build -o "$SWITCH" ./cmd/delayswitch 2>&1); then
			die 2 "--delay: building the user-space delay line failed: $out"
		fi
	fi
	if [ "$USER_DELAY" = 1 ]; then
		setup ip -n "$BRNS" link del br0 # the delay line is the switch
	fi
	for ((i = 0; i < HOSTS; i++)); do
		ns=$(host_ns "$i")
		setup ip netns add "$ns"
		NAMESPACES=("$ns" "${NAMESPACES[@]}")
		setup ip -n "$ns" link set lo up
		setup ip -n "$ns" link add eth0 type veth peer name "vh$i" netns "$BRNS"
		setup ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0
		setup ip -n "$ns" link set eth0 up
		[ "$USER_DELAY" = 1 ] || setup ip -n "$BRNS" link set "vh$i" master br0
		setup ip -n "$BRNS" link set "vh$i" up
		shape "$ns" eth0
		shape "$BRNS" "vh$i"
	done
	# The delay line: every frame between two hosts leaves it DELAY after it arrived. It runs
	# in the bridge namespace, so teardown kills it with everything else there; it also dies
	# with this shell (parent-death signal). Real-time priority: the wire's delay should not
	# depend on how busy the hosts' ranks keep the cores (a SCHED_FIFO thread that sleeps
	# between frames, and to each frame's due time; testbed.sh's header explains --spin).
	if [ "$USER_DELAY" = 1 ]; then
		ports=()
		for ((i = 0; i < HOSTS; i++)); do
			ports+=("vh$i")
		done
		read -r -a switch_flags <<<"${DELAYSWITCH_FLAGS:-}"
		"${PDEATH[@]}" ip netns exec "$BRNS" "$SWITCH" --delay "${DELAY_US}us" --rtprio 10 --spin 0 "${switch_flags[@]}" \
			"${ports[@]}" >"$LOGDIR/delayswitch.log" 2>&1 &
		SWITCH_PID=$!
		PIDS+=("$SWITCH_PID")
		await "$SWITCH_PID" "$LOGDIR/delayswitch.log" $((SECONDS + 5)) "the delay line exited" \
			grep -q '^delayswitch: ready' "$LOGDIR/delayswitch.log" ||
			die 2 "the delay line is not ready after 5s: $(tail -n 5 "$LOGDIR/delayswitch.log")"
	fi
	SHAPING="none"
	if [ -n "$DELAY$RATE" ]; then
		if [ "$USER_DELAY" = 1 ]; then
			SHAPING="delay $DELAY one-way (user-space delay line)${RATE:+, rate $RATE per direction (tbf)}"
		else
			SHAPING="${DELAY:+delay $DELAY one-way ($HALF_DELAY per link end)}${DELAY:+${RATE:+, }}${RATE:+rate $RATE per direction}"
			[ "$USE_NETEM" = 1 ] && SHAPING+=" (netem)" || SHAPING+=" (tbf)"
		fi
	fi
	# Every "host" runs on this machine's cores; the ranks see that themselves (one machine id)
	# and stop spinning when they outnumber the cores, as the bench header's spin= shows.
	say "$HOSTS hosts x $LOCAL ranks in namespaces $PFX-h0..h$((HOSTS - 1)) on $NET.0/24, bridge in $BRNS; shaping: $SHAPING"
}

# reaches_nats I: host I opens a TCP connection to the control plane's port.
reaches_nats() { timeout 2 ip netns exec "$(host_ns "$1")" bash -c "exec 3<>/dev/tcp/$H0IP/4222" 2>/dev/null; }

# start_control_plane starts a2ad serve in host 0 and waits until every host reaches it.
# The control plane listens beyond loopback, so over TLS: a2ad serve makes a CA and a
# certificate for its address itself, and writes the CA into its credentials file, which
# the ranks read (a2ad run --creds): nothing made by hand, as docs/MULTIHOST.md promises.
start_control_plane() {
	CREDS=$LOGDIR/serve.env
	"${PDEATH[@]}" ip netns exec "$(host_ns 0)" "$A2AD" serve --listen "$H0IP:4222" --metrics '' \
		--creds "$CREDS" \
		>"$LOGDIR/serve.log" 2>&1 &
	SERVE_PID=$!
	PIDS+=("$SERVE_PID")
	# Wait until every host reaches the NATS port: the server listens and every link works.
	deadline=$((SECONDS + 15))
	for ((i = 0; i < HOSTS; i++)); do
		await "$SERVE_PID" "$LOGDIR/serve.log" "$deadline" "a2ad serve exited in $(host_ns 0)" reaches_nats "$i" ||
			die 2 "host $i ($(host_ns "$i")) cannot reach the control plane at $H0IP:4222 after 15s"
	done
	await "$SERVE_PID" "$LOGDIR/serve.log" "$deadline" "a2ad serve exited in $(host_ns 0)" \
		grep -q '^a2ad: TLS with a CA made for this start' "$LOGDIR/serve.log" ||
		die 2 "a2ad serve beyond loopback does not say it serves TLS with a CA of its own: $(tail -n 5 "$LOGDIR/serve.log")"
	T_SETUP=$(($(now_us) - T0))
	say "control plane at $NATS_URL in $(host_ns 0), TLS with serve's own CA; setup took $(secs "$T_SETUP")"
}

# The delay line's round trip h0-h1 as the ranks will see it (TCP, one byte each way):
# 2 x --delay plus the hosts' own stack and wake-up costs.
measure_delay_line() {
	if [ "$USER_DELAY" = 1 ] && [ "$HOSTS" -ge 2 ]; then
		"${PDEATH[@]}" ip netns exec "$(host_ns 1)" "$SWITCH" rtt --listen "$(host_ip 1):4299" \
			>"$LOGDIR/rtt.log" 2>&1 &
		rtt_pid=$!
		PIDS+=("$rtt_pid")
		if rtt=$(timeout 20 ip netns exec "$(host_ns 0)" "$SWITCH" rtt --connect "$(host_ip 1):4299" \
			--count 100 --interval 500us 2>&1); then
			say "delay line: round trip h0->h1 (TCP ping-pong) ${rtt#rtt * }; want 2 x $DELAY + the hosts' stack"
		else
			warn "delay line: could not measure the round trip h0-h1: $rtt"
		fi
		kill -TERM "$rtt_pid" 2>/dev/null
		wait "$rtt_pid" 2>/dev/null
	fi
}
