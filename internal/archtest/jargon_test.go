package archtest

import (
	"go/ast"
	"go/token"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// jargon is the protocol vocabulary an error message may use only with a
// hint of what it is: the word, and a word the hint must contain.
var jargon = []struct {
	word *regexp.Regexp
	hint string
}{
	{regexp.MustCompile(`\bLL\b`), "small"},          // "small-message exchange (LL)"
	{regexp.MustCompile(`\bLL slots?\b`), "mailbox"}, // "small-message mailbox (LL slot)"
	{regexp.MustCompile(`\bframes?\b`), "message"},   // "message (frame)"
}

// errorMakers are the calls whose string arguments become error messages.
var errorMakers = map[string]bool{"New": true, "Wrap": true, "Errorf": true, "invalidf": true, "configError": true, "mismatch": true}

// TestErrorsExplainJargon: the errors of the communicator, its engine, the
// transports and dispatch, which users read, say what LL, its slots and
// frames are where they name them (issue 22).
func TestErrorsExplainJargon(t *testing.T) {
	checked := 0
	for _, f := range sources(t) {
		if !userFacing(f.rel) {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || !errorMakers[calledName(call)] {
				return true
			}
			for _, arg := range call.Args {
				ast.Inspect(arg, func(n ast.Node) bool {
					lit, ok := n.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						return true
					}
					s, err := strconv.Unquote(lit.Value)
					if err != nil {
						return true
					}
					checked++
					for _, j := range jargon {
						if j.word.MatchString(s) && !strings.Contains(s, j.hint) {
							t.Errorf("%s:%d: %q says %q without a hint of what it is (want %q in the message)",
								f.rel, f.fset.Position(lit.Pos()).Line, s, j.word.FindString(s), j.hint)
						}
					}
					return true
				})
			}
			return true
		})
	}
	if checked < 100 {
		t.Fatalf("checked only %d error messages", checked)
	}
}

// userFacing reports whether the package of file rel returns errors users
// read: a2a itself, its engine, the transports, dispatch.
func userFacing(rel string) bool {
	for _, dir := range []string{"a2a/", "a2a/internal/engine/", "a2a/transport/", "dispatch/"} {
		rest, ok := strings.CutPrefix(rel, dir)
		if ok && (dir == "a2a/transport/" || !strings.Contains(rest, "/")) {
			return true
		}
	}
	return false
}

// calledName is the name of the function call calls: f for f(...) and
// x.f(...).
func calledName(call *ast.CallExpr) string {
	switch fn := call.Fun.(type) {
	case *ast.Ident:
		return fn.Name
	case *ast.SelectorExpr:
		return fn.Sel.Name
	}
	return ""
}
