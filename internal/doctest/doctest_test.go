package doctest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestOutputPattern: the shown output's words must be there, its numbers may
// differ.
func TestOutputPattern(t *testing.T) {
	for _, tc := range []struct {
		shown, got string
		match      bool
	}{
		{"all 6 steps verified on 3 ranks", "all 6 steps verified on 3 ranks", true},
		{"all 6 steps verified on 3 ranks", "all 7 steps verified on 4 ranks", true},
		{"all 6 steps verified on 3 ranks", "all 6 steps failed on 3 ranks", false},
		{"   1   479/512  33  1.65ms  verified  [...]", "1 2017/2048 31 665µs verified [1 2 3]", true},
		{"   1   479/512  33  1.65ms  verified  [...]", "1 2017/2048 31 665µs MISMATCH [1 2 3]", false},
		{"metrics: a2a_shrinks_total 1, a2a_membership_size 3", "metrics: a2a_shrinks_total 1, a2a_membership_size 3", true},
	} {
		re := OutputPattern(tc.shown)
		if got := re.MatchString(tc.got); got != tc.match {
			t.Errorf("OutputPattern(%q) = %s matches %q: %v, want %v", tc.shown, re, tc.got, got, tc.match)
		}
	}
	if OutputPattern(" ... ") != nil {
		t.Error(`a line of "..." must stand for left-out lines`)
	}
}

// TestMatchOutput: the shown lines in order, others between them.
func TestMatchOutput(t *testing.T) {
	out := "start\nstep 2: lost a rank\nnoise\nall 6 steps verified on 3 ranks\n"
	for _, tc := range []struct {
		shown   []string
		missing string
	}{
		{[]string{"step 2: lost a rank", "...", "all 6 steps verified on 3 ranks"}, ""},
		{[]string{"all 6 steps verified on 3 ranks", "step 2: lost a rank"}, "step 2: lost a rank"},
		{[]string{"step 2: found a rank"}, "step 2: found a rank"},
	} {
		missing, ok := MatchOutput(tc.shown, out)
		if missing != tc.missing || ok != (tc.missing == "") {
			t.Errorf("MatchOutput(%q) = %q, %v; want %q", tc.shown, missing, ok, tc.missing)
		}
	}
}

// TestParse: the language, the comments and what a page may not hold.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, page string
		want       []Block // Page, N, Line, Lang, Mark compared
		err        string
	}{
		{"kinds", "<!-- doc-test: skip: needs a Slurm cluster -->\n```sh\nsbatch x\n```\n\n```text\nout\n```\n<!-- doc-test: run by cmd/a2acheck TestLaunchersDoc -->\n```sh\nmpirun\n```\n",
			[]Block{{N: 1, Line: 2, Lang: "sh", Mark: Mark{Kind: Skip, Reason: "needs a Slurm cluster"}},
				{N: 2, Line: 6, Lang: "text"},
				{N: 3, Line: 10, Lang: "sh", Mark: Mark{Kind: RunBy, Pkg: "cmd/a2acheck", Test: "TestLaunchersDoc"}}}, ""},
		{"skip a command", "<!-- doc-test: skip \"make test\": the suite itself -->\n```sh\nmake demo\nmake test\n```\n",
			[]Block{{N: 1, Line: 2, Lang: "sh", Mark: Mark{Kind: Skip, Cmd: "make test", Reason: "the suite itself"}}}, ""},
		{"no language", "```\nls\n```\n", nil, "page.md:1: a fence without a language"},
		{"stray comment", "<!-- doc-test: skip: x -->\ntext\n```sh\nls\n```\n", nil, "page.md:1: a doc-test comment must be on the line before a fence"},
		{"no reason", "<!-- doc-test: skip -->\n```sh\nls\n```\n", nil, "page.md:1: doc-test comment \"skip\""},
		{"open", "```sh\nls\n", nil, "page.md:1: the fence is never closed"},
		{"closing fence lost", "```sh\nls\n\n## Next\n```sh\npwd\n```\n", nil, "page.md:1: the fence is not closed before the fence of line 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "page.md"), []byte(tc.page), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := Parse(dir, "page.md")
			if tc.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q...", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d blocks, want %d", len(got), len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.N != w.N || g.Line != w.Line || g.Lang != w.Lang || g.Mark != w.Mark {
					t.Errorf("block %d: %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// TestBare: a trailing comment goes, a # in a word or in quotes stays.
func TestBare(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"go run ./examples/moe -h              # every flag", "go run ./examples/moe -h"},
		{"make test", "make test"},
		{`echo "a # b" 'c # d' e#f # note`, `echo "a # b" 'c # d' e#f`},
	} {
		if got := Bare(tc.line); got != tc.want {
			t.Errorf("Bare(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestCommands: continued lines joined, comments and skipped commands left
// out.
func TestCommands(t *testing.T) {
	b := Block{Body: []string{"# comment", "make demo   # the demo", "make test", "mpirun -n 4 \\", "   ./prog", ""},
		Mark: Mark{Kind: Skip, Cmd: "make test", Reason: "x"}}
	want := []string{"make demo   # the demo", "mpirun -n 4 ./prog"}
	if got := b.Commands(); !slices.Equal(got, want) {
		t.Errorf("Commands() = %q, want %q", got, want)
	}
}
