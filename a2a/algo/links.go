package algo

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
)

// Links is the link table: one alpha-beta Link per role, Local for two
// ranks of one host and Remote for ranks of different hosts, and the link
// class (the name of the data plane's provider) that plays each role.
// Every rank of a communicator holds the same table (rank 0's, which it
// measures or loads and then broadcasts at join), so the cost of every
// candidate, computed from the table and a counts matrix every rank holds,
// is the same everywhere and every rank picks the same algorithm.
//
// Mapped is a third class, of the local role's pairs when both ranks'
// buffers are registered: the receiver copies from its mapping of the
// sender's buffer (the mapped-copy class, MappedClass, named after the
// local class: "shm-mapped"), with no kernel call per message. It is zero
// where the local class cannot map registered buffers. Per-call choices
// price with Local: whether a call's buffers are registered is each rank's
// own business, and the ranks must choose alike without a round. Registered
// gives the table for callers that know every buffer is registered.
type Links struct {
	Local       Link   `json:"local"`
	Remote      Link   `json:"remote"`
	Mapped      Link   `json:"mapped,omitzero"`
	LocalClass  string `json:"local_class,omitempty"`
	RemoteClass string `json:"remote_class,omitempty"`
	MappedClass string `json:"mapped_class,omitempty"`
}

// MappedSuffix makes a local class's mapped-copy class name: "shm" ->
// "shm-mapped".
const MappedSuffix = "-mapped"

// Registered is the table for exchanges whose buffers are all registered:
// the local role priced by the mapped-copy class, where there is one.
func (l Links) Registered() Links {
	if l.MappedClass != "" && l.Mapped.Beta > 0 {
		l.Local, l.LocalClass = l.Mapped, l.MappedClass
	}
	return l
}

// ClassLinks are the built-in links of the link classes a communicator may
// use, by class name (the data planes' providers say theirs), used where
// nothing was measured.
type ClassLinks map[string]Link

// Link is the built-in Link of class; DefaultLink for a class not listed.
func (cl ClassLinks) Link(class string) Link {
	if l, ok := cl[class]; ok {
		return l
	}
	return DefaultLink()
}

// Table is the built-in table for the given classes of the two roles, with
// the local class's mapped-copy class where ClassLinks lists one.
func (cl ClassLinks) Table(local, remote string) Links {
	l := Links{Local: cl.Link(local), Remote: cl.Link(remote), LocalClass: local, RemoteClass: remote}
	if m, ok := cl[local+MappedSuffix]; ok {
		l.Mapped, l.MappedClass = m, local+MappedSuffix
	}
	return l
}

// For returns the table for a communicator whose roles are played by the
// classes local and remote: a role whose class differs from the one l was
// measured with takes that class's built-in Link from builtin (a table
// without classes, as older `a2ad tune` files, fits any).
//
// The mapped-copy class follows the local one: a table measured with local
// class shm keeps its Mapped link for shm, and prices a local role played
// by "shm-mapped" itself (a2ad plan --local-class shm-mapped) with it.
func (l Links) For(local, remote string, builtin ClassLinks) Links {
	measuredMapped := l.MappedClass != "" && l.Mapped.Beta > 0
	switch {
	case measuredMapped && local == l.MappedClass:
		l.Local = l.Mapped
	case l.LocalClass != "" && l.LocalClass != local:
		l.Local = builtin.Link(local)
	}
	if l.RemoteClass != "" && l.RemoteClass != remote {
		l.Remote = builtin.Link(remote)
	}
	if want := local + MappedSuffix; !measuredMapped || l.MappedClass != want {
		l.Mapped, l.MappedClass = Link{}, ""
		if m, ok := builtin[want]; ok {
			l.Mapped, l.MappedClass = m, want
		}
	}
	l.LocalClass, l.RemoteClass = local, remote
	return l
}

// Flat is the link that prices a flat (single-level) algorithm: with ranks
// on several hosts most pairs cross hosts and each round waits for the
// slowest, so the remote class; on one host the local class.
func (l Links) Flat(hosts int) Link {
	if hosts > 1 {
		return l.Remote
	}
	return l.Local
}

// Validate reports a table no cost model can use. Mapped may be zero: no
// mapped-copy class.
func (l Links) Validate() error {
	for _, c := range []struct {
		name string
		link Link
	}{{"local", l.Local}, {"remote", l.Remote}, {"mapped", l.Mapped}} {
		if c.name == "mapped" && c.link == (Link{}) {
			continue
		}
		if !(c.link.Alpha >= 0) || !(c.link.Beta > 0) || math.IsInf(c.link.Alpha, 0) || math.IsInf(c.link.Beta, 0) || c.link.Lanes < 0 {
			return fmt.Errorf("links: %s link alpha=%g beta=%g lanes=%d: need alpha >= 0, beta > 0, both finite", c.name, c.link.Alpha, c.link.Beta, c.link.Lanes)
		}
	}
	return nil
}

// ErrBadLinks is wrapped by every error of ParseLinks and LoadLinks about a
// table's contents.
var ErrBadLinks = errors.New("links: invalid link table")

// LoadLinks reads a table written by `a2ad tune` (JSON), as ParseLinks.
func LoadLinks(path string) (Links, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Links{}, err
	}
	l, err := ParseLinks(b)
	if err != nil {
		return Links{}, fmt.Errorf("links %s: %w", path, err)
	}
	return l, nil
}

// ParseLinks decodes a table written by `a2ad tune` (JSON) and validates
// it. Errors wrap ErrBadLinks.
func ParseLinks(b []byte) (Links, error) {
	var l Links
	if err := json.Unmarshal(b, &l); err != nil {
		return Links{}, fmt.Errorf("%w: %w", ErrBadLinks, err)
	}
	if err := l.Validate(); err != nil {
		return Links{}, fmt.Errorf("%w: %w", ErrBadLinks, err)
	}
	return l, nil
}

// EstimateStaged prices the staged two-level AllToAllV (PlanStaged) in
// seconds with the class of each phase's links: phase 1 exchanges among the
// L ranks of each host at once (one round of local messages, each rank
// moving everything it sends to one local index), phase 2 exchanges among
// the H ranks of one local index at once (one round of remote messages, the
// host's aggregated segments). A round costs its link's Alpha plus the
// busiest rank's bytes, sent or received, times Beta. hosts gives each
// rank's host; uneven hosts, which PlanStaged refuses, cost +Inf.
func EstimateStaged(matrix []int, hosts []int, links Links) float64 {
	var s Schedule
	var scratch []int
	return estimateStaged(&s, &scratch, matrix, hosts, links, nil)
}

// estimateStaged is EstimateStaged with its storage in s and scratch, so
// that a Chooser prices staged without allocating once warm; a non-nil work
// gets each rank's own time in each phase.
func estimateStaged(s *Schedule, scratch *[]int, matrix []int, hosts []int, links Links, work *workLog) float64 {
	w := len(hosts)
	if w == 0 || len(matrix) != w*w {
		return math.Inf(1)
	}
	t, err := s.topology(hosts)
	if err != nil {
		return math.Inf(1)
	}
	h, l := t.hosts, t.per
	// Bytes each rank sends and receives in each phase: a block from r to
	// j goes first to fwd, the rank of r's host with j's local index (phase
	// 1, unless r is fwd), then from fwd to j (phase 2, unless fwd is on j's
	// host, i.e. is j).
	if cap(*scratch) < 4*w {
		*scratch = make([]int, 4*w)
	}
	buf := (*scratch)[:4*w]
	clear(buf)
	p1out, p1in, p2out, p2in := buf[:w], buf[w:2*w], buf[2*w:3*w], buf[3*w:]
	for r := range w {
		for j := range w {
			n := matrix[r*w+j]
			if n == 0 || r == j {
				continue
			}
			fwd := t.members[t.host[r]*l+t.local[j]]
			if fwd != r {
				p1out[r] += n
				p1in[fwd] += n
			}
			if fwd != j {
				p2out[fwd] += n
				p2in[j] += n
			}
		}
	}
	intra, inter := 0, 0
	for r := range w {
		intra = max(intra, p1out[r], p1in[r])
		inter = max(inter, p2out[r], p2in[r])
		if work != nil {
			work.t[r] += stagedPhase(l, links.Local, p1out[r]+p1in[r]) + stagedPhase(h, links.Remote, p2out[r]+p2in[r])
		}
	}
	return stagedPhase(l, links.Local, intra) + stagedPhase(h, links.Remote, inter)
}

// stagedPhase is the time of one staged phase among n ranks over link whose
// busiest rank moves bytes; a phase among one rank does not run.
func stagedPhase(n int, link Link, bytes int) float64 {
	if n <= 1 {
		return 0
	}
	return link.Alpha + float64(link.Beta*float64(bytes))
}

// LowerBoundAllToAllVHosts is LowerBoundAllToAllV for ranks spread over
// hosts (hosts gives each rank's host, in any order; hosts may be uneven):
// the larger of two bounds, since local and remote transfers may overlap.
// Bytes between ranks of one host cross that pair's local link, so the
// busiest rank's local bytes, sent or received, take at least
// links.Local's time. Bytes between hosts may be forwarded inside a host
// first (as staged does), so only the host's total is fixed: the busiest
// host's outgoing or incoming bytes, spread over its ranks' remote links,
// take at least links.Remote's time. On one host it is LowerBoundAllToAllV
// under links.Local.
func LowerBoundAllToAllVHosts(matrix []int, hosts []int, links Links) float64 {
	w := len(hosts)
	if w == 0 || len(matrix) != w*w {
		return math.Inf(1)
	}
	var s Schedule
	t := s.numberHosts(hosts)
	if t.hosts == 1 {
		return LowerBoundAllToAllV(matrix, w, links.Local)
	}
	hostOf, ranks := t.host, t.fwd[:t.hosts]
	hostOut, hostIn := make([]int, t.hosts), make([]int, t.hosts)
	for r := range w {
		for j := range w {
			if hostOf[r] != hostOf[j] {
				hostOut[hostOf[r]] += matrix[r*w+j]
				hostIn[hostOf[j]] += matrix[r*w+j]
			}
		}
	}
	local := counts{m: matrix, p: w}.busiest(func(i, j, _ int) bool { return hostOf[i] == hostOf[j] })
	remote := 0.0
	for h := range ranks {
		remote = max(remote, float64(max(hostOut[h], hostIn[h]))/float64(ranks[h]))
	}
	return max(links.Local.Alpha+links.Local.fullRate(float64(local)), links.Remote.Alpha+links.Remote.fullRate(remote))
}

// LowerBoundCrowded is the time no AllToAllV schedule can beat on machines
// whose ranks outnumber their cores (machines gives each rank's machine,
// cores each machine's CPUs; see ChoiceArgs): every byte that changes rank
// is copied on a core of its sender's machine and on one of its receiver's,
// at the Beta of its link (Remote between hosts, Local within one), so the
// busiest crowded machine needs its ranks' bytes times Beta over its cores.
// Machines with enough or unknown cores bound nothing (0); the per-rank
// bound LowerBoundAllToAllVHosts holds there.
func LowerBoundCrowded(matrix, hosts, machines, cores []int, links Links) float64 {
	w := len(hosts)
	if w == 0 || len(matrix) != w*w || len(machines) != w {
		return math.Inf(1)
	}
	ranks, work := make([]int, len(cores)), make([]float64, len(cores))
	for r, m := range machines {
		if m < 0 || m >= len(cores) {
			return math.Inf(1)
		}
		ranks[m]++
		for j := range w {
			link := links.Local
			if hosts[r] != hosts[j] {
				link = links.Remote
			}
			if j != r {
				work[m] += cpuTime(matrix[r*w+j], link)
				work[machines[j]] += cpuTime(matrix[r*w+j], link)
			}
		}
	}
	return busiestCrowded(ranks, work, cores)
}

// fullRate is the time of n bytes from one rank at its full bandwidth: Lanes
// transfers at 1/Beta each.
func (l Link) fullRate(n float64) float64 {
	return float64(l.Beta*n) / float64(max(1, l.Lanes))
}
