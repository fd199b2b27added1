// Command delayswitch is the test bed's user-space delay line (scripts/testbed.sh uses it
// for --delay when the kernel lacks tc netem): an L2 learning switch between network
// interfaces that hands every frame to its output port a fixed one-way delay after the
// frame arrived.
//
//	delayswitch [--delay D] [--spin S] [--queue N] [--rtprio P] IFACE...
//	delayswitch rtt --listen ADDR
//	delayswitch rtt --connect ADDR [--count N] [--interval I]
//
// Every IFACE (the switch-side ends of the hosts' veths) gets an AF_PACKET socket. The
// switch learns source MAC -> port and floods broadcast, multicast and unknown
// destinations to every other port. Frames carry the kernel's virtio-net header
// (PACKET_VNET_HDR) in and out, so GSO super-frames and checksum offload pass through
// unchanged, as through a bridge. One thread runs everything: epoll over the sockets, a
// timerfd armed --spin before the earliest due frame, then a short spin to the due time,
// so the switch sleeps whenever no frame is due. Each output port has its own FIFO; the
// delay is the same for all, so per-port order is arrival order.
//
// It prints "delayswitch: ready ..." on stderr once every port is open, and its counters
// and the lateness of the sends (actual minus due) when SIGTERM, SIGINT or SIGHUP stops
// it (or the parent dies: it asks for SIGTERM then).
//
// rtt is a TCP ping-pong of one byte (TCP_NODELAY) to measure the shaped round trip.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

// config is what the command line sets.
type config struct {
	ifaces []string
	delay  time.Duration
	spin   time.Duration
	queue  int
	rtprio int
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "rtt" {
		os.Exit(rttMain(os.Args[2:]))
	}
	os.Exit(switchMain(os.Args[1:]))
}

func switchMain(args []string) int {
	fs := flag.NewFlagSet("delayswitch", flag.ContinueOnError)
	delay := fs.Duration("delay", 0, "one-way delay of every frame through the switch")
	spin := fs.Duration("spin", 50*time.Microsecond, "at most this long: wake before a frame is due (by the 80th percentile of the timer's wake-up lag) and spin to it (0: sleep to the due time)")
	queue := fs.Int("queue", 8192, "frames queued per output port at most (more are dropped)")
	rtprio := fs.Int("rtprio", 0, "SCHED_FIFO priority of the forwarding thread (0: normal scheduling)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: delayswitch [flags] IFACE...\n       delayswitch rtt --listen ADDR | --connect ADDR [--count N]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() < 1 || *delay < 0 || *spin < 0 || *queue < 1 || *rtprio < 0 || *rtprio > 99 {
		fs.Usage()
		return 2
	}
	cfg := config{
		ifaces: fs.Args(),
		delay:  *delay,
		spin:   *spin,
		queue:  *queue,
		rtprio: *rtprio,
	}
	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "delayswitch: %v\n", err)
		return 1
	}
	return 0
}
