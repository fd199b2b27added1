// Package credsfile reads and writes the credentials file of a2ad serve:
// KEY=VALUE lines that a shell can source (set -a; . FILE; set +a) and that
// package a2a reads when A2A_CREDS names the file. It holds secrets, so it is
// written with mode 0600, never through a file that is already there, and
// refused when others may read it.
package credsfile

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultPath is where a2ad serve keeps its credentials unless told: in the
// user's configuration directory (~/.config/a2ad/serve.env), not in a shared
// temporary directory.
func DefaultPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no configuration directory for the credentials file (%v): give --creds FILE", err)
	}
	return filepath.Join(dir, "a2ad", "serve.env"), nil
}

// Var is one line of the file.
type Var struct{ Key, Value string }

// Read returns the variables of the file at path: KEY=VALUE lines, "export "
// allowed, blank lines and # comments skipped, a value in quotes unquoted. A
// double-quoted value may span lines (a PEM certificate), as in a shell. It
// refuses a file that others may read or write, as ssh does with keys.
func Read(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("credentials file %s is accessible to others (mode %v): chmod 600 it", path, st.Mode().Perm())
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: not KEY=VALUE", path, n)
		}
		k, v = strings.TrimSpace(strings.TrimPrefix(k, "export ")), strings.TrimSpace(v)
		if strings.HasPrefix(v, `"`) && (len(v) == 1 || !strings.HasSuffix(v, `"`)) {
			// A multi-line value: the lines up to the one that ends the quote.
			start := n
			for !strings.HasSuffix(v, `"`) || len(v) == 1 {
				if !sc.Scan() {
					return nil, fmt.Errorf("%s:%d: the quote of %s is never closed", path, start, k)
				}
				n++
				v += "\n" + strings.TrimSpace(sc.Text())
			}
		}
		vars[k] = strings.Trim(v, `"'`)
	}
	return vars, sc.Err()
}

// Write writes vars to path, after the comment lines of header, with mode
// 0600 (its directory 0700 when made). It creates the file and fails when
// one is there, unless replace: then the new file takes the old one's place
// at once (a reader sees the old or the new one, whole). A value that spans
// lines is written in double quotes, which a shell and Read both take.
func Write(path string, header []string, vars []Var, replace bool) error {
	text, err := Format(header, vars)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if !replace {
		return create(path, text)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := create(tmp, text); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return errors.Join(err, os.Remove(tmp))
	}
	return nil
}

// Format is the text of a file of vars after the comment lines of header,
// as Write writes it.
func Format(header []string, vars []Var) (string, error) {
	var b strings.Builder
	for _, h := range header {
		b.WriteString("# " + h + "\n")
	}
	for _, v := range vars {
		switch {
		case strings.ContainsAny(v.Value, "\"'$`\\"):
			return "", fmt.Errorf("credentials file: the value of %s has a quote, $, ` or \\", v.Key)
		case strings.Contains(v.Value, "\n"):
			fmt.Fprintf(&b, "%s=\"%s\"\n", v.Key, strings.TrimSuffix(v.Value, "\n"))
		default:
			fmt.Fprintf(&b, "%s=%s\n", v.Key, v.Value)
		}
	}
	return b.String(), nil
}

// create writes a new file: O_EXCL, so that it never writes through a file
// or link someone else put there.
func create(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return errors.Join(err, os.Remove(path))
	}
	return f.Close()
}
