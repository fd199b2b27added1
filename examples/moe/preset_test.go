package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/reduce"
	"github.com/a2a-moe/a2a/dispatch"
)

// TestPresetFlags checks what each preset sets, that flags given on the
// command line win over it, and that an unknown model is refused.
func TestPresetFlags(t *testing.T) {
	for _, tc := range []struct {
		name               string
		experts, k, hidden int
	}{
		{"deepseek-v3", 256, 8, 7168},
		{"qwen3-30b-a3b", 128, 8, 2048},
		{"mixtral-8x7b", 8, 2, 4096},
	} {
		o, err := parseFlags([]string{"--preset", tc.name}, io.Discard)
		if err != nil {
			t.Fatalf("--preset %s: %v", tc.name, err)
		}
		if o.experts != tc.experts || o.k != tc.k || o.hidden != tc.hidden || o.dtype != reduce.BFloat16 || o.capacity != 0 || o.ffn != presetFFN {
			t.Errorf("--preset %s: experts %d k %d hidden %d %v capacity %g ffn %d, want %d %d %d bfloat16 0 %d",
				tc.name, o.experts, o.k, o.hidden, o.dtype, o.capacity, o.ffn, tc.experts, tc.k, tc.hidden, presetFFN)
		}
	}
	o, err := parseFlags([]string{"--preset", "deepseek-v3", "--k", "4", "--hidden", "256", "--dtype", "float32", "--capacity", "1.5", "--ffn", "8", "--tokens", "7"}, io.Discard)
	if err != nil || o.experts != 256 || o.k != 4 || o.hidden != 256 || o.dtype != reduce.Float32 || o.capacity != 1.5 || o.ffn != 8 || o.tokens != 7 {
		t.Errorf("flags given with the preset: %+v, %v; want experts 256 and the flags' k 4, hidden 256, float32, capacity 1.5, ffn 8, tokens 7", o, err)
	}
	if _, err := parseFlags([]string{"--preset", "gpt-2"}, io.Discard); err == nil || !strings.Contains(err.Error(), `--preset "gpt-2"`) {
		t.Errorf("--preset gpt-2: %v, want an error naming it", err)
	}
}

// figureLine matches the preset's dispatch and combine lines: the average
// time, the logical GB/s and the row size.
var figureLine = regexp.MustCompile(`(?m)^  (dispatch|combine) +avg +(\S+) +logical +([\d.]+) GB/s +\((.+) rows, (\d+) B each\)$`)

// TestPresets runs each preset's layer as processes (2 ranks, a few tokens
// each, every step verified) and checks the DeepEP-style figures: both
// lines, positive logical bandwidths, the model's row sizes (DeepSeek-V3's
// FP8 wire rows 7168 + 56 scales of 4 bytes), and the bytes dispatched
// between the ranks.
func TestPresets(t *testing.T) {
	for _, tc := range []struct {
		preset  string
		wire    dispatch.WireFormat
		experts int
		k       int
		hidden  int
		wireRow int
	}{
		{"deepseek-v3", dispatch.WireFP8, 256, 8, 7168, 7168 + 4*7168/128},
		{"qwen3-30b-a3b", dispatch.WireSame, 128, 8, 2048, 2 * 2048},
		{"mixtral-8x7b", dispatch.WireSame, 8, 2, 4096, 2 * 4096},
	} {
		t.Run(tc.preset, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const steps = 3
			out, err := exec.CommandContext(ctx, moeBin, "-n", "2", "--preset", tc.preset, "--tokens", "8",
				"--steps", strconv.Itoa(steps), "--wire", tc.wire.String()).CombinedOutput()
			if err != nil {
				t.Fatalf("moe --preset %s: %v\n%s", tc.preset, err, out)
			}
			s := string(out)
			header := fmt.Sprintf("moe: 2 ranks, %d experts (%d per rank), top-%d, 8 tokens per rank, hidden %d, ffn %d, bfloat16, capacity 0,",
				tc.experts, tc.experts/2, tc.k, tc.hidden, presetFFN)
			if !strings.Contains(s, header) {
				t.Errorf("no header %q in:\n%s", header, s)
			}
			if !strings.Contains(s, fmt.Sprintf("all %d steps verified on 2 ranks", steps)) {
				t.Errorf("not every step verified:\n%s", s)
			}
			title := fmt.Sprintf("%s: %d experts, top-%d, hidden %d, 2 ranks x 8 tokens; steps 1-2 (step 0 warms up), per rank as DeepEP reports",
				tc.preset, tc.experts, tc.k, tc.hidden)
			if !strings.Contains(s, title) {
				t.Errorf("no figures titled %q in:\n%s", title, s)
			}
			lines := figureLine.FindAllStringSubmatch(s, -1)
			if len(lines) != 2 || lines[0][1] != "dispatch" || lines[1][1] != "combine" {
				t.Fatalf("want a dispatch and a combine line, got %q in:\n%s", lines, s)
			}
			for i, want := range []int{tc.wireRow, 2 * tc.hidden} {
				m := lines[i]
				if d, err := time.ParseDuration(m[2]); err != nil || d <= 0 {
					t.Errorf("%s avg %q: want a positive duration", m[1], m[2])
				}
				if g, _ := strconv.ParseFloat(m[3], 64); g <= 0 {
					t.Errorf("%s logical %q GB/s: want a positive figure", m[1], m[3])
				}
				if m[5] != strconv.Itoa(want) {
					t.Errorf("%s rows of %s B, want %d", m[1], m[5], want)
				}
			}
			if tc.wire == dispatch.WireFP8 && lines[0][4] != "FP8 E4M3 + scales" {
				t.Errorf("dispatch rows %q, want FP8 E4M3 + scales", lines[0][4])
			}
			// Half the rows of 2 ranks' uniform routing go to the other rank:
			// some must have been dispatched between them.
			if !regexp.MustCompile(`(?m)^  step +median \S+ \(slowest rank: dispatch, experts, combine\); dispatched between ranks [\d.]+(KiB|MiB) per step$`).MatchString(s) {
				t.Errorf("no step line with the bytes dispatched between ranks in:\n%s", s)
			}
		})
	}
}
