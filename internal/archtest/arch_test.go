// Package archtest holds the tests of the repository's structure: the
// limits that keep the code readable (a communicator of at most 20 fields,
// no function above a cyclomatic complexity of 25, no Go file above 800
// lines), transports named only inside their packages, and imports that run
// one way, as docs/ARCHITECTURE.md lays them out. It has no code of its own.
package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The limits.
const (
	maxCommFields = 20
	maxComplexity = 25
	maxFileLines  = 800
)

const module = "github.com/a2a-moe/a2a"

// goFile is one non-test, hand-written Go file of the repository.
type goFile struct {
	rel   string // slash-separated, from the repository root
	lines int
	ast   *ast.File
	fset  *token.FileSet
}

// sources parses every non-test, non-generated Go file of the repository.
func sources(t *testing.T) []goFile {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", root, err)
	}
	fset := token.NewFileSet()
	var files []goFile
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, root+string(filepath.Separator)))
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, p, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) {
			return nil
		}
		files = append(files, goFile{rel: rel, lines: strings.Count(string(src), "\n"), ast: f, fset: fset})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 100 {
		t.Fatalf("found only %d Go files under %s", len(files), root)
	}
	return files
}

// TestCommFields: the communicator keeps its state in parts it owns.
func TestCommFields(t *testing.T) {
	found := false
	for _, f := range sources(t) {
		if path.Dir(f.rel) != "a2a" {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != "Comm" {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			found = true
			if n := fieldCount(st); n > maxCommFields {
				t.Errorf("a2a.Comm has %d fields, at most %d: group them into owned parts", n, maxCommFields)
			}
			return false
		})
	}
	if !found {
		t.Fatal("no a2a.Comm struct found")
	}
}

// fieldCount counts a struct's fields, an embedded one as one.
func fieldCount(st *ast.StructType) int {
	n := 0
	for _, fl := range st.Fields.List {
		n += max(1, len(fl.Names))
	}
	return n
}

// TestComplexity: no function above the complexity limit, counting the
// function literals inside it as part of it.
func TestComplexity(t *testing.T) {
	for _, f := range sources(t) {
		for _, d := range f.ast.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			if c := complexity(fn.Body); c > maxComplexity {
				t.Errorf("%s: %s has cyclomatic complexity %d, at most %d", f.rel, funcName(fn), c, maxComplexity)
			}
		}
	}
}

// complexity is 1 plus the branches: if, for, range, non-default case and
// select clauses, && and ||.
func complexity(body *ast.BlockStmt) int {
	c := 1
	ast.Inspect(body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if x.List != nil {
				c++
			}
		case *ast.CommClause:
			if x.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if x.Op == token.LAND || x.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fn.Name.Name
		}
		return fn.Name.Name
	}
}

// TestFileLength: no Go file above the line limit.
func TestFileLength(t *testing.T) {
	for _, f := range sources(t) {
		if f.lines > maxFileLines {
			t.Errorf("%s has %d lines, at most %d: split it by concern", f.rel, f.lines, maxFileLines)
		}
	}
}

// transportNames are the data planes' names: they appear only in their
// packages, in the registration (DefaultProviders, a2a/dataplane.go) and in
// what users read (commands, examples).
var transportNames = []string{"shm", "tcp", "verbs"}

// namesTransports reports whether f may name a transport.
func namesTransports(rel string) bool {
	for _, prefix := range []string{"a2a/transport/", "verbs/", "cmd/", "examples/"} {
		if strings.HasPrefix(rel, prefix) {
			return true
		}
	}
	return rel == "a2a/dataplane.go"
}

// TestTransportNames: outside those places a transport is known by its
// capabilities, never by its name. Go's network names ("tcp" passed to
// net.Listen, net.Dial and the like) are not transports.
func TestTransportNames(t *testing.T) {
	for _, f := range sources(t) {
		if namesTransports(f.rel) {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok && networkCall(call) {
				return false
			}
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && slices.Contains(transportNames, s) {
				t.Errorf("%s:%d: names the transport %q: read its capabilities (transport.Capabilities) instead", f.rel, f.fset.Position(lit.Pos()).Line, s)
			}
			return true
		})
	}
}

// networkCall reports whether call passes a Go network name, as
// net.Listen("tcp", addr) does.
func networkCall(call *ast.CallExpr) bool {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && slices.Contains([]string{"Listen", "Dial", "DialTimeout", "DialContext", "ListenPacket"}, sel.Sel.Name)
}

// layers are the imports of the repository each package may have: the
// one-way layering of docs/ARCHITECTURE.md. A package not listed may import
// anything of the repository but a command.
var layers = map[string][]string{
	"a2a/algo":            {},
	"a2a/reduce":          {"a2a/internal/fault"},
	"a2a/internal/fault":  {},
	"a2a/internal/engine": {"a2a/algo", "a2a/transport", "a2a/reduce", "a2a/internal/fault"},
	"a2a/transport":       {"a2a/internal/fault"},
	"a2a/transport/tcp":   {"a2a/transport", "a2a/internal/fault"},
	"a2a/transport/shm":   {"a2a/transport", "a2a/internal/fault", "internal/cpus"},
	"a2a/transport/verbs": {"a2a/transport", "a2a/internal/fault", "verbs"},
	"a2a/control":         {"a2a/internal/fault"},
	"verbs":               {},
	"routing":             {},
	"dispatch":            {"a2a", "a2a/reduce", "routing", "internal/nap"},
	"internal/cpus":       {},
	"internal/nap":        {},
}

// TestLayers: every package imports only what its layer may.
func TestLayers(t *testing.T) {
	imports := moduleImports(sources(t))
	for pkg, allowed := range layers {
		if imports[pkg] == nil {
			t.Errorf("%s: no such package (update the layers table)", pkg)
		}
		for im := range imports[pkg] {
			if !slices.Contains(allowed, im) {
				t.Errorf("%s imports %s: its layer may import only %v", pkg, im, allowed)
			}
		}
	}
	for pkg, ims := range imports {
		for im := range ims {
			if strings.HasPrefix(im, "cmd/") || im == "examples/moe" {
				t.Errorf("%s imports the command %s", pkg, im)
			}
		}
	}
}

// TestVerbsBinding: the libibverbs binding is a top-level package of its
// own, documented for use outside a2a, with an example.
func TestVerbsBinding(t *testing.T) {
	code, doc := 0, false
	for _, f := range sources(t) {
		if path.Dir(f.rel) != "verbs" {
			continue
		}
		code++
		doc = doc || (f.ast.Doc != nil && strings.HasPrefix(f.ast.Doc.Text(), "Package verbs "))
	}
	if code < 2 || !doc {
		t.Fatalf("verbs/: %d Go files, package doc %v: want the binding with its doc", code, doc)
	}
	examples, err := filepath.Glob("../../verbs/example*_test.go")
	if err != nil || len(examples) == 0 {
		t.Errorf("verbs/ has no example (%v)", err)
	}
}

// TestArchitectureTable: docs/ARCHITECTURE.md's table of packages and
// imports is what the code imports, line by line, and lists every package.
func TestArchitectureTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	table := packageTable(t, string(doc))
	real := moduleImports(sources(t))
	for pkg, ims := range real {
		listed, ok := table[pkg]
		if !ok {
			t.Errorf("ARCHITECTURE.md's package table misses %s (imports %v)", pkg, keys(ims))
			continue
		}
		if listed == nil { // a "tests only" line
			t.Errorf("ARCHITECTURE.md lists %s as tests only, but it has code", pkg)
			continue
		}
		for im := range ims {
			if !listed[im] {
				t.Errorf("ARCHITECTURE.md: %s imports %s, the table does not say so", pkg, im)
			}
		}
		for im := range listed {
			if !ims[im] {
				t.Errorf("ARCHITECTURE.md: the table says %s imports %s; it does not", pkg, im)
			}
		}
	}
	for pkg, listed := range table {
		if _, ok := real[pkg]; !ok && listed != nil {
			t.Errorf("ARCHITECTURE.md lists %s, which has no code", pkg)
		}
	}
}

// packageTable reads the table under "## Packages and imports": a package
// per line, then what it does, then "->" and its imports ("nothing of
// ours": none; a parenthesis is a comment). A line without "->" is a
// package of tests only (nil).
func packageTable(t *testing.T, doc string) map[string]map[string]bool {
	_, rest, ok := strings.Cut(doc, "## Packages and imports")
	if !ok {
		t.Fatal("ARCHITECTURE.md has no \"## Packages and imports\"")
	}
	// The table is the first fenced block: its opening fence (```text) up to
	// the end of that line, then the lines up to the closing fence.
	_, rest, _ = strings.Cut(rest, "```")
	_, rest, _ = strings.Cut(rest, "\n")
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("ARCHITECTURE.md: the package table has no end")
	}
	table := map[string]map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		pkg := strings.Fields(line)[0]
		_, ims, ok := strings.Cut(line, "->")
		if !ok {
			table[pkg] = nil
			continue
		}
		table[pkg] = map[string]bool{}
		if i := strings.Index(ims, "("); i >= 0 {
			ims = ims[:i]
		}
		if strings.TrimSpace(ims) == "nothing of ours" {
			continue
		}
		for _, im := range strings.Split(ims, ",") {
			table[pkg][strings.TrimSpace(im)] = true
		}
	}
	return table
}

// moduleImports is, by package with code, what its non-test files import
// from this module. A file of a package clause and its doc alone is no code.
func moduleImports(files []goFile) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, f := range files {
		if len(f.ast.Decls) == 0 {
			continue
		}
		pkg := path.Dir(f.rel)
		if out[pkg] == nil {
			out[pkg] = map[string]bool{}
		}
		for _, im := range f.ast.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if rest, ok := strings.CutPrefix(p, module+"/"); ok {
				out[pkg][rest] = true
			}
		}
	}
	return out
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
