package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// command is one subcommand of a2ad, with what its help says about it.
type command struct {
	name     string
	synopsis string // the command line after "a2ad NAME"
	about    string // one line: what it does
	more     string // further help, printed after the flags (may be empty)
	run      cmdFunc
}

// commands are a2ad's subcommands in the order the usage lists them. cmdPin,
// the trampoline of --bind core, is not one of them: it is internal.
func commands() []command {
	return []command{
		{"serve", "[--listen HOST:PORT] [--nats URL] [--metrics HOST:PORT] [--creds FILE] [--tls | --tls-cert F --tls-key F] [--tls-ca F] [--insecure]",
			"control plane: embedded NATS, the rendezvous and counts service, /metrics", "", cmdServe},
		{"job", "new [--nats URL] [--creds FILE] [--group G] [--out FILE]",
			"a job's own credentials from a2ad serve (asked with serve's file), as a file for its launcher", jobHelp, cmdJob},
		{"run", "-n N [--nats URL [--creds FILE]] [--group G] [--world W --rank-offset R] -- PROG [ARGS...]",
			"start N local ranks of PROG, as mpirun or torchrun do", "", cmdRun},
		{"bench", "[--op OP] [-n N] [-d DTYPE] [-o REDOP] [--algo A] [--sizes MIN:MAX] [--check] [--json]",
			"nccl-tests style benchmark of one collective on local ranks", benchHelp, cmdBench},
		{"demo", "[-n N] [--steps S]",
			"a verified variable-size AllToAllV on local ranks", "", cmdDemo},
		{"plan", "[--algo A] [-n N] [--dist D] [--sizes S] [--hosts H] [--links FILE] [--rounds R] | --moe LOADS [--redundant R]",
			"estimate each AllToAllV algorithm and auto's pick, run nothing (--rounds -1: whole schedules); --moe: the balanced expert placement", "", cmdPlan},
		{"tune", "[-n N] [--out FILE]",
			"measure the link table (alpha, beta per link class)", "", cmdTune},
		{"devices", "[--require]",
			"RDMA devices, ports and GIDs verbs would use, or why there are none", "", cmdDevices},
	}
}

// usage is a2ad's help without a command.
func usage(w io.Writer) {
	fmt.Fprint(w, "a2ad: the a2a all-to-all service\n\nusage:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  a2ad %s %s\n        %s\n", c.name, c.synopsis, c.about)
	}
	fmt.Fprintf(w, "\nbench ops: %s\n", strings.Join(benchOpNames, ", "))
	fmt.Fprint(w, "\nRun \"a2ad COMMAND -h\" for a command's flags and their valid values.\n")
}

// internalPrefix starts the usage of flags a2ad passes to the copies of
// itself it starts (--worker); the help leaves them out.
const internalPrefix = "internal:"

// helpRequested is parseFlags' error for -h or --help: main prints the
// command's help to standard output and exits 0.
type helpRequested struct{ fs *flag.FlagSet }

func (helpRequested) Error() string { return "help requested" }

// parseFlags parses a command's flags. The flag package's own messages are
// silenced: main reports a bad flag in one line with a pointer to -h, and
// prints the help (internal flags left out) when asked for it.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return helpRequested{fs}
	}
	return err
}

// help prints command c's help with the flags of fs, internal ones left out,
// each with its default as the flag package prints it.
func help(w io.Writer, c command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: a2ad %s %s\n\n%s\n\nflags:\n", c.name, c.synopsis, c.about)
	shown := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.VisitAll(func(f *flag.Flag) {
		if strings.HasPrefix(f.Usage, internalPrefix) {
			return
		}
		shown.Var(f.Value, f.Name, f.Usage)
		shown.Lookup(f.Name).DefValue = f.DefValue // the value now may come from the command line
	})
	shown.SetOutput(w)
	shown.PrintDefaults()
	if c.more != "" {
		fmt.Fprintf(w, "\n%s", c.more)
	}
}

// oneOf is a flag's list of valid values for its usage and errors.
func oneOf(values []string) string { return strings.Join(values, " | ") }
