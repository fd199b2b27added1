package algo

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

func TestEstimateStaged(t *testing.T) {
	links := Links{Local: Link{Alpha: 1, Beta: 0.01}, Remote: Link{Alpha: 10, Beta: 0.1}}
	uniform := func(w, n int) []int {
		m := make([]int, w*w)
		for i := range m {
			m[i] = n
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		matrix []int
		hosts  []int
		want   float64
	}{
		// Each rank stages 200 bytes locally (its block for the local
		// peer and for the peer's partner host) and forwards 200.
		{"2x2 uniform", uniform(4, 100), []int{0, 0, 1, 1}, 1 + 0.01*200 + 10 + 0.1*200},
		{"one host", uniform(3, 100), []int{5, 5, 5}, 1 + 0.01*200},
		{"one rank per host", uniform(3, 100), []int{0, 1, 2}, 10 + 0.1*200},
		{"zeros", uniform(4, 0), []int{0, 0, 1, 1}, 11},
		{"uneven", uniform(3, 1), []int{0, 0, 1}, math.Inf(1)},
		{"bad matrix", []int{1}, []int{0, 1}, math.Inf(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := EstimateStaged(tc.matrix, tc.hosts, links); math.Abs(got-tc.want) > 1e-9 && got != tc.want {
				t.Errorf("EstimateStaged = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLinksFile(t *testing.T) {
	dir := t.TempDir()
	want := Links{Local: Link{Alpha: 1.5e-6, Beta: 1 / 9e9, Lanes: 1}, Remote: Link{Alpha: 12e-6, Beta: 1 / 2e9, Lanes: 2}}
	b, _ := json.Marshal(want)
	good := filepath.Join(dir, "links.json")
	if err := os.WriteFile(good, b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadLinks(good)
	if err != nil || got != want {
		t.Fatalf("LoadLinks = %+v, %v; want %+v", got, err, want)
	}
	for name, text := range map[string]string{
		"zero-beta.json": `{"local":{"Alpha":1e-6,"Beta":0},"remote":{"Alpha":1e-5,"Beta":1e-9}}`,
		"negative.json":  `{"local":{"Alpha":-1,"Beta":1e-9},"remote":{"Alpha":1e-5,"Beta":1e-9}}`,
		"garbage.json":   `{"local":`,
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(text), 0o600)
		if _, err := LoadLinks(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := LoadLinks(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("missing file accepted")
	}
	if err := testLinks().Validate(); err != nil {
		t.Error(err)
	}
	if testLinks().Flat(1) != testLinks().Local || testLinks().Flat(3) != testLinks().Remote {
		t.Error("Flat picks the wrong class")
	}
}

// TestLowerBound: no priced schedule beats LowerBoundAllToAllV, and the
// bound is the busiest rank's traffic.
func TestLowerBound(t *testing.T) {
	link := Link{Alpha: 1e-6, Beta: 1e-9, Lanes: 1}
	m := []int{
		5, 10, 0,
		1, 7, 2,
		30, 0, 9,
	}
	// Rank 0 receives 31 bytes from others, more than any row or column.
	if got, want := LowerBoundAllToAllV(m, 3, link), 1e-6+31e-9; math.Abs(got-want) > 1e-15 {
		t.Errorf("bound %v, want %v", got, want)
	}
	if !math.IsInf(LowerBoundAllToAllV(m, 2, link), 1) {
		t.Error("malformed matrix priced")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 300 {
		p := 2 + rng.IntN(12)
		mat := generators[i%len(generators)].gen(rng, p, 1<<16)
		lb := LowerBoundAllToAllV(mat, p, link)
		for _, a := range []Algo{AlgoPairwise, AlgoFullmesh} {
			if est := EstimateAllToAllV(a, mat, p, 1, 0, link); est < lb*(1-1e-12) {
				t.Fatalf("%v estimated %v below the bound %v for %v", a, est, lb, mat)
			}
		}
		if p <= SkewMaxWorld {
			if est := EstimateSkew(mat, p, 1, link); est < lb*(1-1e-12) {
				t.Fatalf("skew estimated %v below the bound %v for %v", est, lb, mat)
			}
		}
		// Several lanes: the bound is the busiest rank's bytes spread over them.
		wide := Link{Alpha: link.Alpha, Beta: link.Beta, Lanes: 4}
		lbWide := LowerBoundAllToAllV(mat, p, wide)
		if est := EstimateAllToAllV(AlgoFullmesh, mat, p, 4, 4, wide); est < lbWide*(1-1e-12) {
			t.Fatalf("fullmesh over 4 lanes estimated %v below the bound %v for %v", est, lbWide, mat)
		}
	}
}

// TestLowerBoundHosts: across hosts the bound takes the larger of the
// busiest rank's local bytes and the busiest host's remote bytes spread over
// its ranks, and no priced schedule (flat ones at the remote link, staged by
// phase) beats it.
func TestLowerBoundHosts(t *testing.T) {
	links := Links{Local: Link{Alpha: 1e-6, Beta: 1e-10, Lanes: 1}, Remote: Link{Alpha: 1e-5, Beta: 1e-9, Lanes: 1}}
	// Ranks 0,1 on host 7; ranks 2,3 on host 3.
	m := []int{
		0, 50, 10, 0,
		5, 0, 20, 4,
		1, 0, 0, 60,
		0, 2, 3, 0,
	}
	for _, c := range []struct {
		name  string
		hosts []int
		want  float64
	}{
		// Host 7 sends 34 bytes out over 2 ranks (17 each); rank 0's 50 local bytes take 5 ns.
		{"two hosts", []int{7, 7, 3, 3}, max(1e-6+50e-10, 1e-5+17e-9)},
		{"one host", []int{5, 5, 5, 5}, LowerBoundAllToAllV(m, 4, links.Local)},
		// Rank 3 alone on host 9 receives 4+60 bytes.
		{"uneven hosts", []int{7, 7, 3, 9}, max(1e-6+50e-10, 1e-5+64e-9)},
	} {
		if got := LowerBoundAllToAllVHosts(m, c.hosts, links); math.Abs(got-c.want) > 1e-15 {
			t.Errorf("%s: bound %v, want %v", c.name, got, c.want)
		}
	}
	if !math.IsInf(LowerBoundAllToAllVHosts(m, []int{1, 2}, links), 1) {
		t.Error("malformed matrix priced")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 200 {
		h, l := 2+rng.IntN(4), 1+rng.IntN(4)
		p := h * l
		hosts := make([]int, p)
		for r := range hosts {
			hosts[r] = r / l
		}
		mat := generators[i%len(generators)].gen(rng, p, 1<<16)
		lb := LowerBoundAllToAllVHosts(mat, hosts, links)
		if est := EstimateStaged(mat, hosts, links); est < lb*(1-1e-12) {
			t.Fatalf("staged estimated %v below the bound %v for %v on hosts %v", est, lb, mat, hosts)
		}
		for _, a := range []Algo{AlgoPairwise, AlgoFullmesh} {
			if est := EstimateAllToAllV(a, mat, p, 1, 0, links.Flat(h)); est < lb*(1-1e-12) {
				t.Fatalf("%v estimated %v below the bound %v for %v on hosts %v", a, est, lb, mat, hosts)
			}
		}
	}
}

func TestLinksFor(t *testing.T) {
	measured := Links{Local: Link{Alpha: 2e-6, Beta: 1e-10, Lanes: 1}, Remote: Link{Alpha: 7e-6, Beta: 1e-9, Lanes: 2}, LocalClass: "shm", RemoteClass: "tcp"}
	unclassed := measured
	unclassed.LocalClass, unclassed.RemoteClass = "", ""
	for _, c := range []struct {
		name          string
		in            Links
		local, remote string
		want          Links
	}{
		{"same classes", measured, "shm", "tcp", measured},
		{"remote now verbs", measured, "shm", "verbs", Links{Local: measured.Local, Remote: testClasses.Link("verbs"), LocalClass: "shm", RemoteClass: "verbs"}},
		{"tcp inside a host", measured, "tcp", "tcp", Links{Local: testClasses.Link("tcp"), Remote: measured.Remote, LocalClass: "tcp", RemoteClass: "tcp"}},
		{"a table without classes fits any", unclassed, "verbs", "verbs", Links{Local: measured.Local, Remote: measured.Remote, LocalClass: "verbs", RemoteClass: "verbs"}},
		{"defaults", testLinks(), "shm", "verbs", testClasses.Table("shm", "verbs")},
	} {
		if got := c.in.For(c.local, c.remote, testClasses); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	if testClasses.Link("nosuch") != DefaultLink() || testClasses.Link("shm") == testClasses.Link("tcp") {
		t.Error("ClassLinks.Link")
	}
}

// testClasses are built-in links as the default data planes give them
// (a2a.BuiltinLinks): shared memory, TCP and verbs.
var testClasses = ClassLinks{
	"shm":   {Alpha: 1e-6, Beta: 1 / 8e9, Lanes: 1},
	"tcp":   DefaultLink(),
	"verbs": {Alpha: 3e-6, Beta: 1 / 10e9, Lanes: 1},
}

// testLinks is the built-in table of a communicator whose ranks of one host
// talk through shared memory and whose hosts talk through TCP.
func testLinks() Links { return testClasses.Table("shm", "tcp") }

// TestMappedClass: the mapped-copy class comes with its local class from
// the built-in links, survives a file measured on that class, is dropped
// for another local class, prices a local role named after it, and
// Registered swaps it in for the local role; a file's mapped link is
// validated like the others, and may be absent.
func TestMappedClass(t *testing.T) {
	shm, mapped, tcp := Link{Alpha: 1e-6, Beta: 1 / 8e9, Lanes: 1}, Link{Alpha: 3e-6, Beta: 1 / 20e9, Lanes: 1}, Link{Alpha: 1e-5, Beta: 1 / 3e9, Lanes: 1}
	builtin := ClassLinks{"shm": shm, "shm" + MappedSuffix: mapped, "tcp": tcp}
	tab := builtin.Table("shm", "tcp")
	if tab.Mapped != mapped || tab.MappedClass != "shm-mapped" {
		t.Fatalf("Table(shm, tcp) = %+v: want the shm-mapped class", tab)
	}
	if reg := tab.Registered(); reg.Local != mapped || reg.LocalClass != "shm-mapped" || reg.Remote != tcp {
		t.Errorf("Registered() = %+v: want the local role priced as shm-mapped", reg)
	}
	if tcpTab := builtin.Table("tcp", "tcp"); tcpTab.MappedClass != "" || tcpTab.Registered() != tcpTab {
		t.Errorf("Table(tcp, tcp) = %+v: tcp has no mapped-copy class", tcpTab)
	}
	measured := Links{Local: Link{Alpha: 2e-6, Beta: 1 / 7e9, Lanes: 1}, Remote: tcp, Mapped: Link{Alpha: 4e-6, Beta: 1 / 25e9, Lanes: 1},
		LocalClass: "shm", RemoteClass: "tcp", MappedClass: "shm-mapped"}
	if got := measured.For("shm", "tcp", builtin); got != measured {
		t.Errorf("For(shm) of a table measured on shm = %+v, want it unchanged", got)
	}
	if got := measured.For("shm-mapped", "tcp", builtin); got.Local != measured.Mapped || got.LocalClass != "shm-mapped" || got.MappedClass != "" {
		t.Errorf("For(shm-mapped) = %+v: want the measured mapped link as the local role", got)
	}
	if got := measured.For("tcp", "tcp", builtin); got.Local != tcp || got.MappedClass != "" || got.Mapped != (Link{}) {
		t.Errorf("For(tcp) = %+v: want tcp's link and no mapped class", got)
	}
	old := Links{Local: shm, Remote: tcp, LocalClass: "shm", RemoteClass: "tcp"} // a file from before the class
	if got := old.For("shm", "tcp", builtin); got.Mapped != mapped || got.MappedClass != "shm-mapped" {
		t.Errorf("For(shm) of a table without mapped = %+v: want the built-in shm-mapped", got)
	}
	b, _ := json.Marshal(measured)
	if got, err := ParseLinks(b); err != nil || got != measured {
		t.Errorf("ParseLinks(Marshal) = %+v, %v; want %+v", got, err, measured)
	}
	if _, err := ParseLinks([]byte(`{"local":{"Alpha":1e-6,"Beta":1e-9},"remote":{"Alpha":1e-5,"Beta":1e-9},"mapped":{"Alpha":-1,"Beta":1e-9}}`)); err == nil {
		t.Error("ParseLinks accepted a negative mapped alpha")
	}
}
