package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a"
)

// TestOneLLCutoff: plan and bench take the library's LL cutoff (A2A_LL_BYTES,
// default a2a.DefaultLLBytes, capped per data plane), print it as ll=, and
// bench's automatic choice stops sending by LL exactly above it.
func TestOneLLCutoff(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	shm := a2a.ClassLLCutoff("shm", a2a.DefaultLLBytes)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, fmt.Sprintf("ll=shm:%d,tcp:%d:", shm, a2a.DefaultLLBytes)},
		{[]string{"--ll-bytes", "256"}, "ll=shm:256,tcp:256:"},
		{[]string{"--ll-bytes", "-1"}, "ll=off:"},
	} {
		out, err := a2ad(t, ctx, append([]string{"plan", "--sizes", "1K", "--rounds", "0"}, tc.args...)...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("plan %v: %v, want %q in:\n%s", tc.args, err, tc.want, out)
		}
	}

	for _, tc := range []struct {
		env    string
		cutoff int
	}{{"", shm}, {"A2A_LL_BYTES=256", 256}} {
		cmd := a2ad(t, ctx, "bench", "-n", "2", "--sizes", "128:2K", "--iters", "20", "--warmup", "2")
		cmd.Env = append(os.Environ(), "A2A_TRANSPORT=shm", "A2A_ALGO=")
		if tc.env != "" {
			cmd.Env = append(cmd.Env, tc.env)
		}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bench %s: %v\n%s", tc.env, err, out)
		}
		text := string(out)
		if want := fmt.Sprintf(" ll=shm:%d\n", tc.cutoff); !strings.Contains(text, want) {
			t.Errorf("bench %s: no %q in the header:\n%s", tc.env, want, text)
		}
		if !strings.Contains(text, "# size: bytes per peer") {
			t.Errorf("bench %s: the header does not say the size is per peer:\n%s", tc.env, text)
		}
		rows := 0
		for _, line := range strings.Split(text, "\n") {
			f := strings.Fields(line)
			if len(f) != 12 || strings.HasPrefix(line, "#") {
				continue
			}
			rows++
			size, _ := strconv.Atoi(f[0])
			if ll := f[5] == "ll"; ll != (size <= tc.cutoff) {
				t.Errorf("bench %s: %d B went by %s, cutoff %d:\n%s", tc.env, size, f[5], tc.cutoff, text)
			}
		}
		if rows != 5 {
			t.Errorf("bench %s: %d rows, want 5:\n%s", tc.env, rows, text)
		}
	}
}
