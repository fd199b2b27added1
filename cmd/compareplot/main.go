// Command compareplot draws the table of scripts/compare-mpi.sh (make compare) as an SVG:
// the ratios of Open MPI's and MPICH's p50 latency to a2a's against the size per peer,
// one panel per operation and ratio, one line per transport and rank count.
//
//	compareplot [-o OUT.svg] [-title TEXT] [-ratios ompi/a2a,mpich/a2a] [TABLE]
//
// It reads the table from TABLE or standard input and writes the SVG to OUT.svg or
// standard output. Both axes are log2: the sizes double along x, and a ratio of 0.5 lies as
// far below the 1.0 line as 2.0 lies above it. Everything under 1.0 (a2a slower) sits on a
// red band, its point drawn larger and ringed in red, so a 0.5x cell stands out at a
// glance. Ratios beyond the y range (MPICH oversubscribed: 1000x) are drawn
// at its edge, ringed in black; every point's title holds its exact value.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "compareplot:", err)
		os.Exit(2)
	}
}

// run is the command without the process: arguments, the table's default source and
// the SVG's default destination.
func run(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("compareplot", flag.ContinueOnError)
	out := fs.String("o", "", "write the SVG to this file (default: standard output)")
	title := fs.String("title", "", "a line under the heading (the machine, the command)")
	ratios := fs.String("ratios", "ompi/a2a,mpich/a2a", "the ratio columns to plot, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	in := stdin
	switch fs.NArg() {
	case 0:
	case 1:
		f, err := os.Open(fs.Arg(0))
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	default:
		return fmt.Errorf("one table at most, got %d arguments", fs.NArg())
	}
	tab, err := parseTable(in, strings.Split(*ratios, ","))
	if err != nil {
		return err
	}
	// Render in memory first, so a failed plot leaves no half-written file behind.
	var svg bytes.Buffer
	if err := render(&svg, tab, *title); err != nil {
		return err
	}
	if *out == "" {
		_, err = stdout.Write(svg.Bytes())
		return err
	}
	return os.WriteFile(*out, svg.Bytes(), 0o644)
}
