// Package natsd starts the NATS server that a2ad embeds as its default control
// plane, and that tests start in-process.
package natsd

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Start runs an embedded NATS server listening on addr ("host:port"; port 0
// or "" picks a free loopback port) and waits until it accepts clients.
func Start(addr string) (*server.Server, error) {
	host, port := "127.0.0.1", -1
	if addr != "" {
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("nats listen address %q: %w", addr, err)
		}
		if h != "" {
			host = h
		}
		if port, err = strconv.Atoi(p); err != nil {
			return nil, fmt.Errorf("nats listen port %q: %w", p, err)
		}
		if port == 0 {
			port = -1
		}
	}
	opts := &server.Options{
		Host:                  host,
		Port:                  port,
		NoLog:                 true,
		NoSigs:                true,
		MaxPayload:            8 << 20, // a 1024-rank counts matrix is 8 MiB of int64
		MaxPending:            64 << 20,
		WriteDeadline:         10 * time.Second,
		DisableShortFirstPing: true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("nats server on %s:%d not ready", host, port)
	}
	return s, nil
}
