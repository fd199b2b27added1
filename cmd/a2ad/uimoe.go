package main

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/a2a-moe/a2a/a2a/control"
	"github.com/a2a-moe/a2a/metrics"
)

// The live view's MoE panel draws the groups' MoE layers over the last
// minutes. The ranks' reports carry only their latest figures, so serve
// keeps a short history: every second, the rates the service derived from
// the reports, summed over the ranks.

const (
	moeSampleEvery = time.Second
	moeKeep        = 5 * time.Minute
	// moeQuantileWindow is the span the panel's p50 and p99 cover.
	moeQuantileWindow = time.Minute
)

// moeTimeline samples the MoE figures of every group src serves.
type moeTimeline struct {
	src    metrics.TrafficSource
	mu     sync.Mutex
	groups map[string]*moeHistory
	latest time.Time // of the last sample taken
}

// moeHistory is one group's samples, oldest first, within moeKeep.
type moeHistory struct {
	epoch   uint32
	samples []moeSample
	// marks are the samples that saw re-placements, and repl the count of
	// them the last sample saw.
	marks []moeMark
	repl  uint64
}

// moeMark is a sample that saw n more re-placements than the one before
// (one, unless they came faster than serve samples).
type moeMark struct {
	at time.Time
	n  uint64
}

type moeSample struct {
	at        time.Time
	tokens    []float64 // rows per second to each expert, over the group
	load      []float64 // rows per second to each rank: its load
	imbalance float64   // max over mean of load (0: idle)
	estimate  float64   // the dispatchers' estimated max/mean rank load (0: none)
	// dispatch and combine count the steps of every rank by duration, in
	// control.MoEBucketBound's buckets, since the ranks started.
	dispatch, combine []uint64
}

func newMoETimeline(src metrics.TrafficSource) *moeTimeline {
	return &moeTimeline{src: src, groups: map[string]*moeHistory{}}
}

// run samples every moeSampleEvery until ctx ends.
func (tl *moeTimeline) run(ctx context.Context) {
	tick := time.NewTicker(moeSampleEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			tl.sample(now)
		}
	}
}

// sample adds a sample at now to every formed group whose ranks report MoE
// figures, and forgets the groups that are gone. It adds them all at once,
// so that a view sees a tick's samples of every group or of none, and
// latest tells it which.
func (tl *moeTimeline) sample(now time.Time) {
	type taken struct {
		group string
		epoch uint32
		s     moeSample
		repl  uint64
	}
	var samples []taken
	for _, g := range tl.src.Groups() {
		tv, ok := tl.src.Traffic(g.Group)
		if !ok || g.Forming || tv.Epoch != g.Epoch {
			continue
		}
		if s, repl, ok := moeSampleOf(tv, now); ok {
			samples = append(samples, taken{g.Group, tv.Epoch, s, repl})
		}
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	seen := map[string]bool{}
	for _, t := range samples {
		seen[t.group] = true
		h := tl.groups[t.group]
		if h == nil || h.epoch != t.epoch {
			fresh := &moeHistory{epoch: t.epoch}
			if h != nil {
				// A new epoch of a group (a shrink): its ranks' counts go
				// on, so only the re-placements from now on are new.
				fresh.repl = t.repl
			}
			h = fresh
			tl.groups[t.group] = h
		}
		h.add(t.s, t.repl)
	}
	for name := range tl.groups {
		if !seen[name] {
			delete(tl.groups, name)
		}
	}
	tl.latest = now
}

// cursor is the time of the newest samples: a view up to it, asked for
// again with it as since, misses none and repeats none.
func (tl *moeTimeline) cursor() time.Time {
	if tl == nil {
		return time.Time{}
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.latest
}

// add appends s, whose ranks had made repl re-placements, and drops what is
// older than moeKeep.
func (h *moeHistory) add(s moeSample, repl uint64) {
	if repl > h.repl {
		h.marks = append(h.marks, moeMark{at: s.at, n: repl - h.repl})
	}
	h.repl = max(h.repl, repl)
	h.samples = append(h.samples, s)
	cut := s.at.Add(-moeKeep)
	i := 0
	for i < len(h.samples) && h.samples[i].at.Before(cut) {
		i++
	}
	h.samples = append(h.samples[:0], h.samples[i:]...)
	i = 0
	for i < len(h.marks) && h.marks[i].at.Before(cut) {
		i++
	}
	h.marks = append(h.marks[:0], h.marks[i:]...)
}

// moeSampleOf sums the ranks' MoE figures of tv; false when no rank
// reported any. It also returns the group's re-placements (each is
// collective: the most any rank counted).
func moeSampleOf(tv control.TrafficView, now time.Time) (moeSample, uint64, bool) {
	s := moeSample{at: now, load: make([]float64, tv.Size)}
	var repl uint64
	have := false
	for _, rt := range tv.Ranks {
		m := rt.MoE
		if m == nil {
			continue
		}
		have = true
		s.tokens = addFloats(s.tokens, m.TokenRate)
		for j, v := range m.RankRowRate {
			if j < len(s.load) {
				s.load[j] += v
			}
		}
		s.dispatch = addUints(s.dispatch, m.DispatchTime)
		s.combine = addUints(s.combine, m.CombineTime)
		s.estimate = max(s.estimate, m.RankImbalance)
		repl = max(repl, m.Replacements)
	}
	s.imbalance = imbalance(s.load)
	return s, repl, have
}

// imbalance is max over mean of load, 0 when there is none.
func imbalance(load []float64) float64 {
	var sum, top float64
	for _, v := range load {
		sum += v
		top = max(top, v)
	}
	if sum <= 0 {
		return 0
	}
	return top / (sum / float64(len(load)))
}

func addFloats(dst, src []float64) []float64 {
	for len(dst) < len(src) {
		dst = append(dst, 0)
	}
	for i, v := range src {
		dst[i] += v
	}
	return dst
}

func addUints(dst, src []uint64) []uint64 {
	for len(dst) < len(src) {
		dst = append(dst, 0)
	}
	for i, v := range src {
		dst[i] += v
	}
	return dst
}

// uiMoE is a group's MoE panel in /ui/api/groups. Series are oldest first,
// one entry per sample; Ages are the samples' and the re-placements' ages in
// seconds.
type uiMoE struct {
	Experts int `json:"experts"`
	// Partial says the series hold only the samples and re-placements
	// after the request's since; KeepS is how far back the full history
	// goes, so a page merging partial answers knows what to forget.
	Partial bool    `json:"partial"`
	KeepS   float64 `json:"keep_s"`
	// Dispatches counts the group's dispatches (summed over the ranks).
	Dispatches uint64 `json:"dispatches"`
	// Tokens is the rows dispatched to each expert since the ranks started,
	// over the group.
	Tokens []uint64 `json:"tokens"`
	// Dropped counts the assignments dropped over capacity, DroppedRate
	// lately per second.
	Dropped     uint64  `json:"dropped"`
	DroppedRate float64 `json:"dropped_rate"`
	// Dispatch and Combine are the steps' durations over the last minute.
	Dispatch uiQuantiles `json:"dispatch"`
	Combine  uiQuantiles `json:"combine"`
	Wire     []uiWire    `json:"wire"`
	// Replacements counts the re-placements of the experts, ReplaceBytes
	// the parameter bytes they moved.
	Replacements uint64 `json:"replacements"`
	ReplaceBytes uint64 `json:"replace_bytes"`

	Ages []float64 `json:"ages_s"`
	// TokenRate[s][e] is rows per second to expert e at sample s, over the
	// group; Load[s][j] the rows per second to rank j.
	TokenRate [][]float64 `json:"token_rate"`
	Load      [][]float64 `json:"load"`
	// Imbalance[s] is max over mean of Load[s] (0: idle), Estimate[s] the
	// dispatchers' estimate of it under their current placement (0: none).
	Imbalance []float64 `json:"imbalance"`
	Estimate  []float64 `json:"estimate"`
	// ReplaceAges are the ages of the samples within the history that saw
	// re-placements, ReplaceCounts how many each saw.
	ReplaceAges   []float64 `json:"replace_ages_s"`
	ReplaceCounts []uint64  `json:"replace_counts"`
}

type uiQuantiles struct {
	Steps uint64  `json:"steps"`
	P50   float64 `json:"p50_s"`
	P99   float64 `json:"p99_s"`
}

type uiWire struct {
	Format string `json:"format"`
	DType  uint64 `json:"dtype_bytes"`
	Wire   uint64 `json:"wire_bytes"`
	Saved  uint64 `json:"saved_bytes"`
}

// view returns group's MoE panel at now from its traffic view tv and the
// history sampled after since (all of it if since is zero) up to upTo; nil
// when no rank reported MoE figures.
func (tl *moeTimeline) view(tv control.TrafficView, now, since, upTo time.Time) *uiMoE {
	m := moeTotals(tv)
	if m == nil {
		return nil
	}
	if tl == nil {
		return m
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	h := tl.groups[tv.Group]
	if h == nil || h.epoch != tv.Epoch || len(h.samples) == 0 {
		return m
	}
	m.Partial, m.KeepS = !since.IsZero(), moeKeep.Seconds()
	for _, s := range h.samples {
		if !s.at.After(since) || s.at.After(upTo) {
			continue
		}
		m.Ages = append(m.Ages, now.Sub(s.at).Seconds())
		m.TokenRate = append(m.TokenRate, rounded(s.tokens))
		m.Load = append(m.Load, rounded(s.load))
		m.Imbalance = append(m.Imbalance, s.imbalance)
		m.Estimate = append(m.Estimate, s.estimate)
		m.Experts = max(m.Experts, len(s.tokens))
	}
	for _, k := range h.marks {
		if !k.at.After(since) || k.at.After(upTo) {
			continue
		}
		m.ReplaceAges = append(m.ReplaceAges, now.Sub(k.at).Seconds())
		m.ReplaceCounts = append(m.ReplaceCounts, k.n)
	}
	// The quantiles of the steps since the sample a minute back (all of
	// them while the history is shorter).
	last := h.samples[len(h.samples)-1]
	var base moeSample
	for _, s := range h.samples {
		if s.at.After(last.at.Add(-moeQuantileWindow)) {
			break
		}
		base = s
	}
	m.Dispatch = quantiles(last.dispatch, base.dispatch)
	m.Combine = quantiles(last.combine, base.combine)
	return m
}

// rounded is v to a tenth: rows per second need no more, and the JSON of
// five minutes of a few hundred experts stays small.
func rounded(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Round(x*10) / 10
	}
	return out
}

// moeTotals is the part of the panel the ranks' latest reports give.
func moeTotals(tv control.TrafficView) *uiMoE {
	var m *uiMoE
	var dispatch, combine []uint64
	for _, rt := range tv.Ranks {
		r := rt.MoE
		if r == nil {
			continue
		}
		if m == nil {
			m = &uiMoE{Wire: []uiWire{}, Ages: []float64{}, TokenRate: [][]float64{}, Load: [][]float64{},
				Imbalance: []float64{}, Estimate: []float64{}, ReplaceAges: []float64{}, ReplaceCounts: []uint64{}}
		}
		m.Dispatches += r.Dispatches
		m.Tokens = addUints(m.Tokens, r.Tokens)
		m.Dropped += r.Dropped
		m.DroppedRate += r.DroppedRate
		m.Replacements = max(m.Replacements, r.Replacements)
		m.ReplaceBytes += r.ReplaceBytes
		dispatch, combine = addUints(dispatch, r.DispatchTime), addUints(combine, r.CombineTime)
		m.Wire = addWire(m.Wire, r.Wire)
	}
	if m == nil {
		return nil
	}
	if m.Tokens == nil {
		m.Tokens = []uint64{}
	}
	m.Experts = len(m.Tokens)
	m.Dispatch, m.Combine = quantiles(dispatch, nil), quantiles(combine, nil)
	return m
}

func addWire(dst []uiWire, src []control.WireBytes) []uiWire {
next:
	for _, w := range src {
		saved := w.DType - min(w.Wire, w.DType)
		for i := range dst {
			if dst[i].Format == w.Format {
				dst[i].DType, dst[i].Wire, dst[i].Saved = dst[i].DType+w.DType, dst[i].Wire+w.Wire, dst[i].Saved+saved
				continue next
			}
		}
		dst = append(dst, uiWire{Format: w.Format, DType: w.DType, Wire: w.Wire, Saved: saved})
	}
	return dst
}

// quantiles are the p50 and p99 of the durations counted in cur and not in
// base (both in control.MoEBucketBound's buckets; base may be shorter),
// interpolated within their bucket.
func quantiles(cur, base []uint64) uiQuantiles {
	d := make([]uint64, len(cur))
	var n uint64
	for i, v := range cur {
		if i < len(base) && base[i] <= v {
			v -= base[i]
		}
		d[i] = v
		n += v
	}
	return uiQuantiles{Steps: n, P50: quantile(d, n, 0.5), P99: quantile(d, n, 0.99)}
}

func quantile(counts []uint64, n uint64, q float64) float64 {
	if n == 0 {
		return 0
	}
	rank := q * float64(n)
	var acc float64
	for i, c := range counts {
		if c == 0 {
			continue
		}
		if acc+float64(c) >= rank {
			lo := 0.0
			if i > 0 {
				lo = control.MoEBucketBound(i - 1).Seconds()
			}
			hi := control.MoEBucketBound(i).Seconds()
			if i == control.MoEBuckets-1 {
				hi = 2 * lo // the open bucket: read it as one more doubling
			}
			return lo + (hi-lo)*math.Max(0, (rank-acc)/float64(c))
		}
		acc += float64(c)
	}
	return control.MoEBucketBound(control.MoEBuckets - 2).Seconds()
}
