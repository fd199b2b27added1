package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// parseSize reads "8", "1K", "64KiB", "1M", "2G" (binary multiples).
func parseSize(s string) (int, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "IB"), "B")
	mult := 1
	switch {
	case strings.HasSuffix(t, "K"):
		mult, t = 1<<10, t[:len(t)-1]
	case strings.HasSuffix(t, "M"):
		mult, t = 1<<20, t[:len(t)-1]
	case strings.HasSuffix(t, "G"):
		mult, t = 1<<30, t[:len(t)-1]
	}
	v, err := strconv.Atoi(t)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v * mult, nil
}

// parseSizes reads "MIN:MAX" (doubling steps), a comma list, or one size.
func parseSizes(s string) ([]int, error) {
	if lo, hi, ok := strings.Cut(s, ":"); ok {
		a, err := parseSize(lo)
		if err != nil {
			return nil, err
		}
		b, err := parseSize(hi)
		if err != nil {
			return nil, err
		}
		if a > b {
			return nil, fmt.Errorf("sizes %q: min > max", s)
		}
		var out []int
		for v := a; v <= b; v *= 2 {
			out = append(out, v)
			if v == 0 {
				v = 1 // 0, 1, 2, 4, ...
				out = append(out, 1)
			}
		}
		return out, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		v, err := parseSize(part)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// dist is a traffic distribution for benchmark count matrices.
type dist struct {
	kind  string // uniform | zipf | lognormal | hot
	param float64
}

func parseDist(s string) (dist, error) {
	kind, p, has := strings.Cut(s, ":")
	d := dist{kind: kind}
	defaults := map[string]float64{"uniform": 0, "zipf": 1.0, "lognormal": 1.0, "hot": 0.5}
	def, ok := defaults[kind]
	if !ok {
		return d, fmt.Errorf("unknown distribution %q (uniform, zipf:S, lognormal:SIGMA, hot:F)", s)
	}
	d.param = def
	if has {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v < 0 || (kind == "hot" && v > 1) {
			return d, fmt.Errorf("bad parameter in distribution %q", s)
		}
		d.param = v
	}
	return d, nil
}

func (d dist) String() string {
	if d.kind == "uniform" {
		return d.kind
	}
	return fmt.Sprintf("%s:%g", d.kind, d.param)
}

// matrix returns the n x n row-major counts matrix for per-peer size: every
// row sums to n*size bytes (the uniform per-rank total, as the peers' MPI
// harness does), while skewed distributions unbalance the receivers. The same
// seed gives the same matrix on every rank.
func (d dist) matrix(n, size int, seed uint64) []int {
	m := make([]int, n*n)
	if d.kind == "uniform" {
		for i := range m {
			m[i] = size
		}
		return m
	}
	rng := rand.New(rand.NewPCG(seed, uint64(n)<<32|uint64(size)))
	total := n * size
	w := make([]float64, n)
	pop := make([]float64, n)
	perm := rng.Perm(n)
	hot := int(seed % uint64(n))
	for j := range pop {
		pop[j] = 1 / math.Pow(float64(perm[j]+1), d.param) // zipf popularity of destination j
	}
	for i := range n {
		sum := 0.0
		for j := range w {
			switch d.kind {
			case "zipf":
				w[j] = pop[j] * (0.5 + rng.Float64())
			case "lognormal":
				w[j] = math.Exp(d.param*rng.NormFloat64() - d.param*d.param/2)
			case "hot":
				w[j] = (1 - d.param) / float64(n)
				if j == hot {
					w[j] += d.param
				}
			}
			sum += w[j]
		}
		acc := 0
		for j := range w {
			m[i*n+j] = int(math.Floor(float64(total) * w[j] / sum))
			acc += m[i*n+j]
		}
		for k := 0; acc < total; k, acc = k+1, acc+1 {
			m[i*n+(i+k)%n]++
		}
	}
	return m
}

// pattern is the byte rank src puts at index k of its block for dst; the
// receiver recomputes it to verify every byte.
func pattern(src, dst, k int) byte {
	h := uint32(src)*0x9E3779B1 ^ uint32(dst)*0x85EBCA77 ^ uint32(k)*0xC2B2AE3D ^ uint32(uint64(k)>>32)
	h ^= h >> 15
	h *= 0x2C1B3C6D
	h ^= h >> 12
	h *= 0x297A2D39
	h ^= h >> 15
	return byte(h)
}

// fillSend lays out rank's send buffer for the counts row.
func fillSend(buf []byte, rank int, row []int) {
	off := 0
	for dst, n := range row {
		for k := range n {
			buf[off+k] = pattern(rank, dst, k)
		}
		off += n
	}
}

// verifyRecv checks rank's receive buffer against what every source sent;
// it returns the first bad offset or -1.
func verifyRecv(buf []byte, rank int, col []int) int {
	off := 0
	for src, n := range col {
		for k := range n {
			if buf[off+k] != pattern(src, rank, k) {
				return off + k
			}
		}
		off += n
	}
	return -1
}
