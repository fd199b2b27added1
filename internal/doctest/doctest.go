// Package doctest reads the fenced blocks of the repository's Markdown pages
// so that tests can run the documented commands as written (issue 22: every
// documented command is a test).
//
// A fence's language says what the block is: sh, bash and console blocks are
// commands (console: "$ " lines, each followed by the output it prints), any
// other language is not (text for output samples and diagrams, go, yaml, ...),
// and a fence without a language is an error, so that no block is silently
// left out. An HTML comment on the line before the fence says how a command
// block is run when it is not run as it stands:
//
//	<!-- doc-test: skip: REASON -->            not run here, for REASON
//	<!-- doc-test: skip "CMD": REASON -->      the lines starting with CMD are not run
//	<!-- doc-test: run by PKG TestName -->     a test of its own runs it (PKG: a directory)
package doctest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Pages returns the Markdown pages whose blocks are tested, relative to the
// repository root root: README.md, docs/*.md and the READMEs under examples/
// and deploy/.
func Pages(root string) ([]string, error) {
	pages := []string{"README.md"}
	for _, pattern := range []string{"docs/*.md", "examples/*/README.md", "deploy/README.md", "deploy/*/README.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			return nil, err
		}
		for _, p := range m {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return nil, err
			}
			pages = append(pages, filepath.ToSlash(rel))
		}
	}
	return pages, nil
}

// A Block is one fenced block of a page.
type Block struct {
	Page string // the page, as given to Parse
	N    int    // its place among the page's fenced blocks, from 1
	Line int    // the line of its opening fence, from 1
	Lang string // the first word after the fence ("" for none)
	Body []string
	Mark Mark // the doc-test comment before the fence
}

// ID names the block in test names and in lists of blocks: page#N.
func (b Block) ID() string { return fmt.Sprintf("%s#%d", b.Page, b.N) }

// IsCommand reports whether the block holds commands to run.
func (b Block) IsCommand() bool { return slices.Contains([]string{"sh", "bash", "console"}, b.Lang) }

// The kinds of doc-test comment.
const (
	Run   = ""       // no comment: the block runs as it stands
	Skip  = "skip"   // not run (Mark.Cmd "") or its lines starting with Mark.Cmd not run
	RunBy = "run by" // Mark.Pkg's Mark.Test runs it
)

// A Mark is a doc-test comment.
type Mark struct {
	Kind   string // Run, Skip or RunBy
	Reason string // Skip: why
	Cmd    string // Skip: the command whose lines are not run; "": the whole block
	Pkg    string // RunBy: the package directory, from the repository root
	Test   string // RunBy: the test function
}

var (
	markRe  = regexp.MustCompile(`^<!--\s*doc-test:\s*(.*?)\s*-->$`)
	skipRe  = regexp.MustCompile(`^skip(?:\s+"([^"]+)")?:\s*(\S.*)$`)
	runByRe = regexp.MustCompile(`^run by\s+(\S+)\s+(Test\w*)$`)
)

// parseMark reads the text of a doc-test comment.
func parseMark(s string) (Mark, error) {
	if m := skipRe.FindStringSubmatch(s); m != nil {
		return Mark{Kind: Skip, Cmd: m[1], Reason: m[2]}, nil
	}
	if m := runByRe.FindStringSubmatch(s); m != nil {
		return Mark{Kind: RunBy, Pkg: m[1], Test: m[2]}, nil
	}
	return Mark{}, fmt.Errorf("doc-test comment %q: want `skip: REASON`, `skip \"CMD\": REASON` or `run by PKG TestName`", s)
}

// Parse returns the fenced blocks of the page at filepath.Join(root, page).
// A fence without a language, a fence not closed before the next one opens,
// a doc-test comment that is not before a fence, or one that does not parse,
// is an error.
func Parse(root, page string) ([]Block, error) {
	raw, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		return nil, err
	}
	var (
		blocks  []Block
		b       *Block
		mark    *Mark
		markAt  int
		lines   = strings.Split(string(raw), "\n")
		errorAt = func(n int, format string, a ...any) error {
			return fmt.Errorf("%s:%d: %s", page, n, fmt.Sprintf(format, a...))
		}
	)
	for i, line := range lines {
		n := i + 1
		trimmed := strings.TrimSpace(line)
		switch {
		case b != nil && trimmed == "```":
			blocks = append(blocks, *b)
			b = nil
		case b != nil && strings.HasPrefix(trimmed, "```"):
			// A fence with a language closes nothing: it opens a block, so
			// the one before lost its closing fence (a merge dropped it) and
			// swallows what follows, its commands and marks unseen.
			return nil, errorAt(b.Line, "the fence is not closed before the fence of line %d", n)
		case b != nil:
			b.Body = append(b.Body, line)
		case strings.HasPrefix(trimmed, "```"):
			lang, _, _ := strings.Cut(strings.TrimPrefix(trimmed, "```"), " ")
			if lang == "" {
				return nil, errorAt(n, "a fence without a language: say what the block is (sh, console, text for output, ...)")
			}
			b = &Block{Page: page, N: len(blocks) + 1, Line: n, Lang: lang}
			if mark != nil {
				b.Mark, mark = *mark, nil
			}
		case markRe.MatchString(trimmed):
			m, err := parseMark(markRe.FindStringSubmatch(trimmed)[1])
			if err != nil {
				return nil, errorAt(n, "%v", err)
			}
			mark, markAt = &m, n
		case mark != nil:
			return nil, errorAt(markAt, "a doc-test comment must be on the line before a fence")
		}
	}
	if b != nil {
		return nil, errorAt(b.Line, "the fence is never closed")
	}
	if mark != nil {
		return nil, errorAt(markAt, "a doc-test comment must be on the line before a fence")
	}
	return blocks, nil
}

// Commands returns the commands of a sh or bash block: lines continued with a
// backslash joined, blank and comment lines left out, and the lines a
// `skip "CMD"` comment names left out.
func (b Block) Commands() []string {
	var cmds []string
	cont := ""
	for _, line := range b.Body {
		line = cont + strings.TrimSpace(line)
		if c, ok := strings.CutSuffix(line, `\`); ok {
			cont = c
			continue
		}
		cont = ""
		if line == "" || strings.HasPrefix(line, "#") || b.skips(line) {
			continue
		}
		cmds = append(cmds, line)
	}
	if cont != "" {
		cmds = append(cmds, cont)
	}
	return cmds
}

// skips reports whether the block's comment leaves out the command line.
func (b Block) skips(line string) bool {
	if b.Mark.Kind != Skip || b.Mark.Cmd == "" {
		return false
	}
	line = Bare(line)
	return line == b.Mark.Cmd || strings.HasPrefix(line, b.Mark.Cmd+" ")
}

// Bare returns a command line without its trailing comment (a # that starts
// a word outside quotes) and the spaces before it: the command as lists of
// commands name it.
func Bare(line string) string {
	var quote rune
	prev := ' '
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (prev == ' ' || prev == '\t'):
			return strings.TrimSpace(line[:i])
		}
		prev = r
	}
	return strings.TrimSpace(line)
}

// A Step is a command of a console block and the output the page shows for it.
type Step struct {
	Cmd    string
	Output []string
}

// Steps returns the "$ " commands of a console block with the lines that
// follow each. Lines before the first command are an error.
func (b Block) Steps() ([]Step, error) {
	var steps []Step
	for i, line := range b.Body {
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, Step{Cmd: cmd})
			continue
		}
		if len(steps) == 0 {
			return nil, fmt.Errorf("%s:%d: a console block starts with a \"$ \" command", b.Page, b.Line+1+i)
		}
		if strings.TrimSpace(line) != "" {
			steps[len(steps)-1].Output = append(steps[len(steps)-1].Output, line)
		}
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("%s:%d: a console block without a \"$ \" command", b.Page, b.Line)
	}
	return steps, nil
}

// OutputPattern turns a line of output a page shows into what the real line
// must match: the words are as shown, but a word with a digit in it stands for
// any word (times, sizes and counts vary from run to run), and "..." for
// anything. A line that is only "..." gives nil: it stands for lines left out.
func OutputPattern(shown string) *regexp.Regexp {
	fields := strings.Fields(shown)
	if len(fields) == 1 && fields[0] == "..." {
		return nil
	}
	parts := make([]string, len(fields))
	for i, f := range fields {
		switch {
		case strings.ContainsAny(f, "0123456789"):
			parts[i] = `\S+`
		default:
			q := regexp.QuoteMeta(f)
			parts[i] = strings.ReplaceAll(q, regexp.QuoteMeta("..."), `.*`)
		}
	}
	return regexp.MustCompile(`^\s*` + strings.Join(parts, `\s+`) + `\s*$`)
}

// MatchOutput checks that the lines a page shows appear in out, in order, each
// matching OutputPattern; other lines may come between them. It returns the
// first shown line that was not found.
func MatchOutput(shown []string, out string) (missing string, ok bool) {
	got := strings.Split(out, "\n")
	at := 0
	for _, s := range shown {
		re := OutputPattern(s)
		if re == nil {
			continue
		}
		for at < len(got) && !re.MatchString(got[at]) {
			at++
		}
		if at == len(got) {
			return s, false
		}
		at++
	}
	return "", true
}
