package doctest

import "slices"

// A Broken is a documented command known to fail today. The tests still run
// it: while it fails they only log it, and once it passes they fail until its
// entry is removed, so that the list only shrinks.
type Broken struct {
	Block  string // Block.ID: page#N
	Cmd    string // the command line, without its comment (Bare)
	Reason string
}

// Known lists the documented commands that fail today, with why: each is
// being fixed elsewhere or has been reported.
var Known = []Broken{
	{"examples/moe/README.md#1", "go run ./examples/moe -h", "moe prints its help for -h, then exits with status 1 (reported)"},
	// Across the test bed's namespaces (cmd/a2acheck's TestLaunchersDoc as
	// root); on one machine they pass.
	{"docs/LAUNCHERS.md#3", "mpirun -n 4 --host node0:2,node1:2 -x A2A_NATS_URL -x A2A_CREDS ./prog", acrossHosts},
	{"docs/LAUNCHERS.md#3", `mpiexec -n 4 -hosts node0,node1 -genv A2A_GROUP "job-$(date +%s)-$$" ./prog`, acrossHosts},
	{"docs/LAUNCHERS.md#3", "torchrun --nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500 --nproc-per-node 2 --no-python ./prog", acrossHosts},
}

// acrossHosts is why the launcher lines without the page's A2A_LISTEN
// wrapper fail on two hosts.
const acrossHosts = "across hosts the ranks listen on 127.0.0.1 unless A2A_LISTEN says otherwise, so node1's " +
	"cannot reach node0's (peer lost: tcp: rank 0 at 127.0.0.1:PORT unreachable); the wrapper of the page's " +
	"\"Ranks on several hosts\" is needed (reported)"

// KnownBroken returns the entry of Known for the command cmd of block id.
func KnownBroken(id, cmd string) (Broken, bool) {
	i := slices.IndexFunc(Known, func(k Broken) bool { return k.Block == id && k.Cmd == Bare(cmd) })
	if i < 0 {
		return Broken{}, false
	}
	return Known[i], true
}
