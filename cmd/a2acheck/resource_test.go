package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// TestLowDescriptorLimit runs 6 ranks, one of them (rank 2) under a
// descriptor limit too low for its links, over TCP (8 streams per peer)
// and over shared memory. Rank 2 fails at Join with ErrResource naming
// itself, what it needs and the fix; every other rank fails with the abort
// wrapping that cause; nobody is named lost.
func TestLowDescriptorLimit(t *testing.T) {
	for _, tc := range []struct {
		transport string
		streams   int
	}{
		{"tcp", 8},
		{"shm", 2},
	} {
		t.Run(tc.transport, func(t *testing.T) {
			script := fmt.Sprintf(`if [ "$A2A_RANK" = 2 ]; then ulimit -n 24; fi; exec %s`, checkBin)
			cmd := command(t, a2adBin, "run", "-n", "6", "--", "sh", "-c", script)
			cmd.Env = append(cleanEnv(), "A2A_TRANSPORT="+tc.transport, fmt.Sprintf("A2A_STREAMS=%d", tc.streams))
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the job succeeded with rank 2 out of descriptors:\n%s", out)
			}
			lines := regexp.MustCompile(`(?m)^\[rank ([0-9])\] a2acheck: (.*)$`).FindAllStringSubmatch(string(out), -1)
			seen := map[string]bool{}
			for _, m := range lines {
				rank, msg := m[1], m[2]
				seen[rank] = true
				want := []string{"out of resources (rank 2)", "rank 2 is out of file descriptors", "raise ulimit -n to at least"}
				if rank != "2" {
					want = append(want, "communicator aborted (rank 2)")
				}
				for _, w := range want {
					if !strings.Contains(msg, w) {
						t.Errorf("rank %s: %q, want it to say %q", rank, msg, w)
					}
				}
			}
			if len(seen) != 6 {
				t.Errorf("%d of 6 ranks reported an error", len(seen))
			}
			if strings.Contains(string(out), "peer lost") {
				t.Errorf("a healthy rank was named lost")
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}
