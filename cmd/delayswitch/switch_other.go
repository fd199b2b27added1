//go:build !linux

package main

import "errors"

func run(config) error { return errors.New("needs Linux (AF_PACKET sockets)") }
