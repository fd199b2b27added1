package a2a

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/a2a-moe/a2a/a2a/algo"
)

// TestLinksAgreed: every rank ends up with rank 0's link table, whether rank
// 0 measured it at join, loaded it from a file, or used the defaults, even
// when the other ranks were configured differently.
func TestLinksAgreed(t *testing.T) {
	url := startNATS(t)
	file := filepath.Join(t.TempDir(), "links.json")
	fromFile := algo.Links{Local: algo.Link{Alpha: 3e-6, Beta: 1 / 5e9, Lanes: 1}, Remote: algo.Link{Alpha: 40e-6, Beta: 1 / 1e9, Lanes: 2}}
	b, _ := json.Marshal(fromFile)
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		rank0 string
		check func(algo.Links) error
	}{
		{"defaults", LinksDefault, func(l algo.Links) error {
			if l != BuiltinLinks().Table("shm", "tcp") {
				return fmt.Errorf("%+v, want the defaults", l)
			}
			return nil
		}},
		{"file", file, func(l algo.Links) error {
			// The file names no classes, so it prices the ones in use.
			if want := fromFile.For("shm", "tcp", BuiltinLinks()); l != want {
				return fmt.Errorf("%+v, want %+v", l, want)
			}
			return nil
		}},
		{"probe", LinksProbe, func(l algo.Links) error {
			if err := l.Validate(); err != nil {
				return err
			}
			if l.LocalClass != "shm" || l.RemoteClass != "tcp" {
				return fmt.Errorf("%+v: classes, want shm and tcp", l)
			}
			if l.Local == BuiltinLinks().Table("shm", "tcp").Local || l.Remote == BuiltinLinks().Table("shm", "tcp").Remote {
				return fmt.Errorf("%+v: a class kept its default", l)
			}
			if l.Local.Alpha <= 0 || l.Local.Alpha > 0.1 || l.Remote.Alpha <= 0 || l.Remote.Alpha > 0.1 {
				return fmt.Errorf("%+v: implausible latencies", l)
			}
			// The mapped-copy class, measured from registered buffers.
			if l.MappedClass != "shm-mapped" || l.Mapped == BuiltinLinks().Table("shm", "tcp").Mapped {
				return fmt.Errorf("%+v: the mapped-copy class is not measured", l)
			}
			if l.Mapped.Alpha < 0 || l.Mapped.Alpha > 0.1 || l.Mapped.Beta <= 0 || 1/l.Mapped.Beta > 1e12 {
				return fmt.Errorf("%+v: implausible mapped link", l)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := group(t, url, 3, func(c *Config) {
				c.Host = fmt.Sprintf("host%d", c.Rank/2) // ranks 0,1 share a host, rank 2 is remote
				if c.Rank == 0 {
					c.Links = tc.rank0
				} else {
					c.Links = LinksProbe // ignored: rank 0 decides
				}
			})
			for _, c := range comms {
				if err := tc.check(c.Links()); err != nil {
					t.Errorf("rank %d: %v", c.Rank(), err)
				}
				if c.Links() != comms[0].Links() {
					t.Errorf("rank %d holds %+v, rank 0 %+v", c.Rank(), c.Links(), comms[0].Links())
				}
			}
			// The probe left the communicator in step: a collective works.
			exchange(t, comms, matrixOf("random", 3, rand.New(rand.NewPCG(1, 2))), false)
		})
	}
}

// TestLinksBadFile: a link table rank 0 cannot read fails its join with
// ErrInvalidArgument and releases the other ranks.
func TestLinksBadFile(t *testing.T) {
	url := startNATS(t)
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"local":{"Alpha":1,"Beta":0}}`), 0o600)
	name := fmt.Sprintf("links-bad-%d", time.Now().UnixNano())
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := Config{NATSURL: url, Group: name, Rank: r, WorldSize: 2, Logger: discard,
				HeartbeatInterval: 100 * time.Millisecond, PeerTimeout: time.Second}
			if r == 0 {
				cfg.Links = bad
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Join(ctx, cfg)
			if err == nil {
				c.Close()
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	if !errors.Is(errs[0], ErrInvalidArgument) {
		t.Errorf("rank 0: %v, want ErrInvalidArgument", errs[0])
	}
	if errs[1] == nil {
		t.Error("rank 1 joined a group whose rank 0 failed")
	}
}
