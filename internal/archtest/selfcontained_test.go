package archtest

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// outside matches references to material that is not in the repository:
// the sibling directory the project started from and its research notes
// ("seed 001", "seeds 001 §4.2"). A clone has neither.
var outside = regexp.MustCompile(`\.\./shared\b|\bseeds? [0-9]{3}\b`)

// mdLink matches the target of a Markdown link.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestNothingPointsOutside: no file of the repository (code, comments,
// docs, scripts) refers to material outside it, and every relative link of
// a Markdown file names a file or directory of the repository.
func TestNothingPointsOutside(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(root, "internal", "archtest", "selfcontained_test.go")
	checked := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || p == self {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(data[:min(len(data), 8192)], 0) >= 0 {
			return nil // binary
		}
		checked++
		rel, _ := filepath.Rel(root, p)
		for i, line := range strings.Split(string(data), "\n") {
			if m := outside.FindString(line); m != "" {
				t.Errorf("%s:%d refers to %q, outside the repository: %s", rel, i+1, m, strings.TrimSpace(line))
			}
			if filepath.Ext(p) != ".md" {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				abs := filepath.Join(filepath.Dir(p), filepath.FromSlash(target))
				if r, err := filepath.Rel(root, abs); err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) {
					t.Errorf("%s:%d links to %s, outside the repository", rel, i+1, m[1])
				} else if _, err := os.Stat(abs); err != nil {
					t.Errorf("%s:%d links to %s, which does not exist", rel, i+1, m[1])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d files read under %s: is this the repository?", checked, root)
	}
}
