package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"
)

// rttMain is `delayswitch rtt`: a TCP ping-pong (one byte each way, TCP_NODELAY) that
// measures the round trip between two hosts of the test bed.
func rttMain(args []string) int {
	fs := flag.NewFlagSet("delayswitch rtt", flag.ContinueOnError)
	listen := fs.String("listen", "", "echo every byte received on ADDR (until killed)")
	connect := fs.String("connect", "", "ping-pong with the echo server at ADDR")
	count := fs.Int("count", 200, "round trips measured (after 10 unmeasured)")
	interval := fs.Duration("interval", time.Millisecond, "pause between round trips")
	wait := fs.Duration("wait", 5*time.Second, "how long --connect retries a refused connection")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if (*listen == "") == (*connect == "") || *count < 1 {
		fmt.Fprintln(os.Stderr, "delayswitch rtt: want exactly one of --listen ADDR, --connect ADDR")
		return 2
	}
	var err error
	if *listen != "" {
		err = echo(*listen)
	} else {
		err = pingPong(*connect, *count, *interval, *wait)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "delayswitch rtt: %v\n", err)
		return 1
	}
	return 0
}

func echo(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

func pingPong(addr string, count int, interval, wait time.Duration) error {
	var c net.Conn
	var err error
	for deadline := time.Now().Add(wait); ; {
		c, err = net.DialTimeout("tcp", addr, time.Second)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = c.SetDeadline(time.Now().Add(time.Duration(count+10)*(interval+time.Second) + 5*time.Second))
	var b [1]byte
	rtts := make([]time.Duration, 0, count)
	for i := range count + 10 {
		t0 := time.Now()
		if _, err := c.Write(b[:]); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return err
		}
		if i >= 10 {
			rtts = append(rtts, time.Since(t0))
		}
		time.Sleep(interval)
	}
	slices.Sort(rtts)
	q := func(f float64) float64 { return float64(rtts[int(f*float64(len(rtts)-1))].Nanoseconds()) / 1e3 }
	fmt.Printf("rtt %s: min %.0f p50 %.0f p90 %.0f p99 %.0f max %.0f us (%d round trips)\n",
		addr, q(0), q(0.5), q(0.9), q(0.99), q(1), len(rtts))
	return nil
}
