package algo

import "math"

// Link prices moving bytes between two ranks with an alpha-beta model.
type Link struct {
	Alpha float64 // seconds per message: latency plus per-message overhead
	Beta  float64 // seconds per byte of one transfer (one stream)
	// Lanes is how many transfers one rank drives in parallel, each at the
	// full 1/Beta rate: its effective concurrency. More transfers than that
	// share the rank's bandwidth. Values below 1 mean 1.
	Lanes int
}

// DefaultLink is a TCP loopback link on a small machine: 10 µs per message,
// 3 GB/s, and a single lane (loopback copies are CPU-bound, and on two cores
// shared by all ranks parallel transfers do not add bandwidth).
func DefaultLink() Link { return Link{Alpha: 10e-6, Beta: 1 / 3e9, Lanes: 1} }

// NominalPairBytes is the per-pair message size ChooseAllToAllV assumes when
// it is not given a counts matrix.
const NominalPairBytes = 64 << 10

// EstimateAllToAllV prices an AllToAllV run with algorithm a, in seconds.
// matrix is the global counts matrix in row-major order (matrix[i*world+j] =
// bytes rank i sends rank j), or nil for a uniform NominalPairBytes per pair.
// Frames are assumed cut at DefaultBlockSize.
//
// The model, kept simple on purpose (calibration belongs to the Link):
//   - a message of n bytes over s streams uses f = min(streams, frames(n))
//     transfers and takes Beta·n / min(f, Lanes);
//   - a round costs Alpha (the messages of one round overlap their latency)
//     plus its slowest rank; the local copy is free;
//   - pairwise: Σ_{k=1..p-1} (Alpha + max_i time(n[i][i+k])), which with one
//     lane is the textbook (p-1)·Alpha + Beta·Σ_k max_i n[i][i+k];
//   - fullmesh: Σ_rounds (Alpha + max_i t_i), where rank i's t_i is the bytes
//     it sends (or receives, whichever is more) in the round divided by
//     min(its transfers in flight, Lanes) times Beta, and never less than its
//     slowest single message.
//
// With one lane fullmesh never costs more than pairwise (fewer rounds, and a
// round's max of sums is at most the sum of its distances' maxima); pairwise
// stays the reference and the override for links where concurrency hurts.
// It returns +Inf for algorithms it cannot price and for a malformed matrix.
// AlgoAuto prices ChooseAllToAllV's pick.
//
// Every product is rounded explicitly (float64(x*y)) so that no platform fuses
// multiply-adds: ranks on different architectures compute identical costs and
// therefore choose identically.
func EstimateAllToAllV(a Algo, matrix []int, world, streams, window int, link Link) float64 {
	if a == AlgoAuto {
		a = ChooseAllToAllV(world, streams, window, matrix, link)
	}
	return estimateFlat(a, matrix, world, streams, window, link, nil)
}

// estimateFlat is EstimateAllToAllV for pairwise and fullmesh; a non-nil
// work also gets the time each rank itself spends in each round.
func estimateFlat(a Algo, matrix []int, world, streams, window int, link Link, work *workLog) float64 {
	m, ok := newCounts(matrix, world)
	if !ok {
		return math.Inf(1)
	}
	if streams < 1 {
		streams = 1
	}
	if link.Lanes < 1 {
		link.Lanes = 1
	}
	switch a {
	case AlgoPairwise:
		return estimatePairwise(m, streams, link, work)
	case AlgoFullmesh:
		return estimateFullmesh(m, streams, fullmeshWindow(window, world), link, work)
	}
	return math.Inf(1)
}

// ChooseAllToAllV picks the cheaper of pairwise and fullmesh under
// EstimateAllToAllV. Its inputs must be data every rank holds identically
// (world, configuration, link table and optionally the global counts matrix)
// so that all ranks pick the same algorithm without an extra round of
// agreement. Ties go to pairwise, and world <= 2 is always pairwise (both
// algorithms are then the same single exchange).
func ChooseAllToAllV(world, streams, window int, matrix []int, link Link) Algo {
	if world <= 2 {
		return AlgoPairwise
	}
	pw := EstimateAllToAllV(AlgoPairwise, matrix, world, streams, window, link)
	fm := EstimateAllToAllV(AlgoFullmesh, matrix, world, streams, window, link)
	if fm < pw {
		return AlgoFullmesh
	}
	return AlgoPairwise
}

// counts reads a counts matrix, or the nominal uniform one without storing it.
type counts struct {
	m       []int
	p       int
	uniform bool
}

func newCounts(matrix []int, world int) (counts, bool) {
	if world < 1 {
		return counts{}, false
	}
	if matrix == nil {
		return counts{p: world, uniform: true}, true
	}
	if len(matrix) != world*world {
		return counts{}, false
	}
	for _, n := range matrix {
		if n < 0 {
			return counts{}, false
		}
	}
	return counts{m: matrix, p: world}, true
}

func (c counts) at(i, j int) int {
	if c.uniform {
		return NominalPairBytes
	}
	return c.m[i*c.p+j]
}

// busiest is the largest off-diagonal row or column sum of c counting only
// the entries keep accepts (n bytes from rank i to rank j; every entry when
// keep is nil): the bytes the busiest rank sends or receives, which bounds
// any schedule carrying them at one rank's bandwidth.
func (c counts) busiest(keep func(i, j, n int) bool) int {
	b := 0
	for i := range c.p {
		sent, recvd := 0, 0
		for j := range c.p {
			if j == i {
				continue
			}
			if n := c.at(i, j); keep == nil || keep(i, j, n) {
				sent += n
			}
			if n := c.at(j, i); keep == nil || keep(j, i, n) {
				recvd += n
			}
		}
		b = max(b, sent, recvd)
	}
	return b
}

// ranks is how many ranks to price: with the uniform matrix every rank sees
// the same thing, so rank 0 alone keeps auto selection O(p) per operation.
func (c counts) ranks() int {
	if c.uniform {
		return 1
	}
	return c.p
}

// transfers is how many parallel transfers a message of n bytes uses.
func transfers(n, streams int) int {
	if n == 0 {
		return 0
	}
	return min(streams, FrameCount(n, DefaultBlockSize))
}

// msgTime is the bandwidth time of one message on its own.
func msgTime(n, streams int, l Link) float64 {
	if n == 0 {
		return 0
	}
	return float64(l.Beta*float64(n)) / float64(min(transfers(n, streams), l.Lanes))
}

// cpuTime is the time a rank's core spends on n bytes it sends or receives:
// on a crowded machine (see Chooser.crowdedBound) each end copies every
// byte on a core, and lanes add no cores.
func cpuTime(n int, l Link) float64 { return float64(l.Beta * float64(n)) }

// workLog collects each rank's own time under a candidate, for the bound
// of crowded machines (Chooser.crowdedBound): per round its alpha, and
// every byte it sends or receives at the Beta of the pair's link. A nil
// *workLog collects nothing.
type workLog struct {
	t     []float64 // by rank
	hosts []int     // each rank's host; nil: every pair at the candidate's link
	links Links
}

// round adds a round's alpha to rank i.
func (w *workLog) round(i int, alpha float64) {
	if w != nil {
		w.t[i] += alpha
	}
}

// moved adds to rank i's time the n bytes it sends to or receives from
// peer: at the local or remote Beta when the hosts are known, else at
// flat's. Each rank is credited with its own bytes, so pricing rank 0 alone
// (the uniform nominal matrix) gives its whole time.
func (w *workLog) moved(i, peer, n int, flat Link) {
	if w == nil || n == 0 {
		return
	}
	l := flat
	if w.hosts != nil {
		l = w.links.Remote
		if w.hosts[i] == w.hosts[peer] {
			l = w.links.Local
		}
	}
	w.t[i] += cpuTime(n, l)
}

func estimatePairwise(c counts, streams int, l Link, work *workLog) float64 {
	total := 0.0
	for k := 1; k < c.p; k++ {
		worst := 0.0
		for i := 0; i < c.ranks(); i++ {
			worst = max(worst, msgTime(c.at(i, (i+k)%c.p), streams, l))
			work.round(i, l.Alpha)
			work.moved(i, (i+k)%c.p, c.at(i, (i+k)%c.p), l)
			work.moved(i, (i-k+c.p)%c.p, c.at((i-k+c.p)%c.p, i), l)
		}
		total += l.Alpha + worst
	}
	return total
}

func estimateFullmesh(c counts, streams, window int, l Link, work *workLog) float64 {
	p := c.p
	total := 0.0
	for j0 := 0; j0 < p-1; j0 += window {
		j1 := min(j0+window, p-1)
		worst := 0.0
		for i := 0; i < c.ranks(); i++ {
			sent, recvd, fs, fr := 0, 0, 0, 0
			slowest := 0.0
			for j := j0; j < j1; j++ {
				d := fullmeshDistance(j, p)
				ns, nr := c.at(i, (i+d)%p), c.at((i-d+p)%p, i)
				sent += ns
				recvd += nr
				work.moved(i, (i+d)%p, ns, l)
				work.moved(i, (i-d+p)%p, nr, l)
				fs += transfers(ns, streams)
				fr += transfers(nr, streams)
				slowest = max(slowest, msgTime(ns, streams, l), msgTime(nr, streams, l))
			}
			t := slowest
			if sent > 0 {
				t = max(t, float64(l.Beta*float64(sent))/float64(min(fs, l.Lanes)))
			}
			if recvd > 0 {
				t = max(t, float64(l.Beta*float64(recvd))/float64(min(fr, l.Lanes)))
			}
			worst = max(worst, t)
			work.round(i, l.Alpha)
		}
		total += l.Alpha + worst
	}
	return total
}
