package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSoakDetects runs short soaks that fail on purpose and checks that the
// soak notices: a wrong byte is named with its rank and offset, and a
// leaked goroutine, descriptor and 4 MiB fail the leak check. (make test runs
// the passing soak itself: make soak-short.)
func TestSoakDetects(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "soak")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tests := []struct {
		inject string
		want   []string
	}{
		{"corrupt", []string{"block from rank 1: byte", "want"}},
		{"leak", []string{"leak after warm-up: goroutines", "fds", "live heap"}},
	}
	for _, tt := range tests {
		t.Run(tt.inject, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "--n", "2", "--duration", "1s", "--transport", "auto", "--inject", tt.inject).CombinedOutput()
			if err == nil {
				t.Fatalf("soak --inject %s passed:\n%s", tt.inject, out)
			}
			if !strings.Contains(string(out), "soak: FAIL seed") {
				t.Errorf("no FAIL line with the seed:\n%s", out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
