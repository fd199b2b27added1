package credsfile

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const pemValue = "-----BEGIN CERTIFICATE-----\nMIIBsTCCAVegAwIBAgIQ\nF+oqfdPH13XD==\n-----END CERTIFICATE-----"

// TestWriteRead: what Write writes, Read and a shell that sources the file
// both read back, a PEM value spanning lines included; the file is 0600 and
// Write never overwrites unless told to replace.
func TestWriteRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a2ad", "serve.env")
	vars := []Var{{"A2A_NATS_USER", "a2a"}, {"A2A_SECRET", "00ff"}, {"A2A_NATS_TLS_CA", pemValue + "\n"}}
	if err := Write(path, []string{"header"}, vars, false); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("file: %v %v, want mode 0600", st, err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got["A2A_NATS_USER"] != "a2a" || got["A2A_SECRET"] != "00ff" || got["A2A_NATS_TLS_CA"] != pemValue || len(got) != 3 {
		t.Errorf("read back %q", got)
	}
	out, err := exec.Command("bash", "-c", `set -a; . "$0"; set +a; printf %s "$A2A_NATS_TLS_CA"`, path).CombinedOutput()
	if err != nil || string(out) != pemValue {
		t.Errorf("a shell sourcing the file reads A2A_NATS_TLS_CA %q (%v), want %q", out, err, pemValue)
	}
	if err := Write(path, nil, vars[:1], false); !errors.Is(err, fs.ErrExist) {
		t.Errorf("writing over the file: %v, want fs.ErrExist", err)
	}
	if err := Write(path, nil, vars[:1], true); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(path); err != nil || len(got) != 1 {
		t.Errorf("after replace: %q %v, want one variable", got, err)
	}
	if left, _ := filepath.Glob(path + ".*"); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if err := Write(path, nil, []Var{{"A2A_SECRET", `a"b`}}, true); err == nil {
		t.Error("a value with a quote was written")
	}
}

// TestReadRefuses: a file others may read, an unclosed quote and a line that
// is not KEY=VALUE are errors that name the fix or the line.
func TestReadRefuses(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"readable by others", "A2A_SECRET=x\n", 0o644, "chmod 600"},
		{"unclosed quote", "A2A_SECRET=x\nA2A_NATS_TLS_CA=\"-----BEGIN\nabc\n", 0o600, ":2: the quote of A2A_NATS_TLS_CA"},
		{"not KEY=VALUE", "# c\nA2A_SECRET\n", 0o600, ":2: not KEY=VALUE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.WriteFile(path, []byte(tc.content), tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			if _, err := Read(path); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Read: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
