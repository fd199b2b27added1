package main

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/a2a-moe/a2a/a2a"
)

// benchHelp closes `a2ad bench -h`: what the columns of the rows mean.
const benchHelp = `Each row is one size, with nccl-tests' columns (the header's "# size:"
line says what size counts for the op):
  size    bytes: per peer block for alltoallv, alltoall, allgather, gather and
          scatter; the buffer each rank passes for the others (rounded down to
          whole elements, and for reducescatter to n blocks)
  count   elements of the type a rank moves in all (nccl-tests' count)
  type    the element type (-d); redop (-o) and root (-r) are "none" and -1
          for ops without them
  algo    the algorithm a2a picked for the last call; with --algo all,
          auto>ALGO for the automatic choice, then one row per forced
          algorithm (staged needs equal ranks on several hosts, and falls
          back to fullmesh), and a comment line comparing auto to the best
  avg_us, p50_us, p99_us
          the slowest rank's time per call over the timed calls
  algbw   bytes moved by a rank (count elements) over the average time
  busbw   algbw times nccl-tests' factor: 2(n-1)/n for allreduce, 1 for
          broadcast and reduce, (n-1)/n for the others
  #wrong  elements found wrong by --check over all ranks (N/A without it)
--json prints the same fields, one object per row (wrong is null without
--check). At the end, two comment lines on stderr say what, besides a2a,
decides a run's figures on a shared VM (docs/PERFORMANCE.md): "# load:",
how much of the CPUs processes outside the job took while it ran, and
"# floor:", one cache line's round trip between the first two CPUs before
and after the run, which tells where the hypervisor placed them. With
--settle, a "# settle:" line on stderr says how many untimed calls the
first size had before it was measured.
`

// benchRow is one line of output; the JSON keys are a stable interface
// (scripts/compare-mpi.sh reads size, p50_us and algo).
type benchRow struct {
	Op    string  `json:"op"`
	Algo  string  `json:"algo"`
	Ranks int     `json:"ranks"`
	Size  int     `json:"size"`
	Count int     `json:"count"` // elements of Type, as nccl-tests counts them
	Type  string  `json:"type"`
	Redop string  `json:"redop"` // "none" unless the op reduces
	Root  int     `json:"root"`  // -1 unless the op has a root
	Avg   float64 `json:"avg_us"`
	P50   float64 `json:"p50_us"`
	P99   float64 `json:"p99_us"`
	AlgBW float64 `json:"algbw_gbps"`
	BusBW float64 `json:"busbw_gbps"`
	Wrong *int    `json:"wrong"` // wrong elements over all ranks; null without --check
	Check string  `json:"check"` // ok, fail, or skip without --check
	// Forced is the algorithm --algo all set for this row ("auto" for the
	// automatic choice); absent otherwise.
	Forced string `json:"forced,omitempty"`
}

// wrongText is the #wrong column: N/A without --check, as nccl-tests prints.
func (r benchRow) wrongText() string {
	if r.Wrong == nil {
		return "N/A"
	}
	return strconv.Itoa(*r.Wrong)
}

// printBenchHeader prints the comment lines that open the text output: the
// run's settings and the column names.
func printBenchHeader(c *a2a.Comm, f benchFlags, d dist) {
	spin, yield := c.WaitPolicy()
	fmt.Printf("# a2ad bench op=%s ranks=%d dist=%s counts=%s streams=%d window=%d seed=%d transport=%s spin=%v yield=%v timing=%s alloc=%s ll=%s\n",
		f.op, c.Size(), d, f.counts, c.Config().Streams, c.Config().Window, f.seed, c.TransportName(), spin, yield, f.timing, f.alloc, llNote(c))
	fmt.Printf("# size: %s; ll: blocks up to these bytes go by the LL protocol, per data plane (A2A_LL_BYTES capped by the plane's slot)\n", sizeMeaning(f.op))
	fmt.Printf("# %10s %12s %8s %6s %5s %-12s %10s %10s %10s %11s %11s %7s\n",
		"size", "count", "type", "redop", "root", "algo", "avg_us", "p50_us", "p99_us", "algbw_GB/s", "busbw_GB/s", "#wrong")
}

// sizeMeaning says what the size column counts for op, as benchHelp does.
func sizeMeaning(op string) string {
	switch op {
	case "alltoallv", "alltoall", "allgather", "gather", "scatter":
		return "bytes per peer (the block a rank sends or receives from each rank)"
	case "barrier":
		return "unused (a barrier moves no data)"
	}
	return "bytes of the buffer each rank passes"
}

// report prints a row on rank 0 and fails when --check found wrong
// elements.
func (b *bench) report(size int, row benchRow) error {
	if b.c.Rank() == 0 {
		printRow(b.f.json, row)
	}
	if row.Check == "fail" {
		return fmt.Errorf("size %d: %d elements of the results are wrong", size, *row.Wrong)
	}
	return nil
}

func printRow(asJSON bool, row benchRow) {
	if asJSON {
		out, _ := json.Marshal(row)
		fmt.Println(string(out))
		return
	}
	fmt.Printf("  %10d %12d %8s %6s %5d %-12s %10.2f %10.2f %10.2f %11.3f %11.3f %7s\n", row.Size, row.Count, row.Type, row.Redop, row.Root,
		row.Algo, row.Avg, row.P50, row.P99, row.AlgBW, row.BusBW, row.wrongText())
}
