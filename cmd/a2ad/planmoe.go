package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/a2a-moe/a2a/routing"
)

// planMoE prints what routing.Balance does with the expert loads of source
// (see readLoads) on n ranks over hosts hosts with redundant extra slots:
// the estimated max/mean rank load of the contiguous placement and of the
// balanced one, and the balanced slots of every rank. It runs nothing.
func planMoE(ctx context.Context, w io.Writer, source string, n, hosts, redundant int) error {
	load, err := readLoads(ctx, source)
	if err != nil {
		return err
	}
	if hosts < 1 || n%hosts != 0 {
		return usageError{fmt.Errorf("--hosts %d: want a divisor of -n %d", hosts, n)}
	}
	slots := len(load) + redundant
	start := time.Now()
	pl, err := routing.Balance(load, n, n/hosts, slots)
	took := time.Since(start)
	if err != nil {
		return usageError{fmt.Errorf("--moe with -n %d --redundant %d: %w", n, redundant, err)}
	}
	contiguous, err := routing.Contiguous(len(load), n)
	if err != nil {
		return err
	}
	before, _ := contiguous.RankLoad(load)
	after, _ := pl.RankLoad(load)
	fmt.Fprintf(w, "moe placement: %d experts on %d ranks (%d per host), %d slots (%d redundant); routing.Balance took %v\n",
		len(load), n, n/hosts, slots, redundant, took.Round(time.Microsecond))
	fmt.Fprintf(w, "max/mean rank load: contiguous %.2f, balanced %.2f\n", routing.Imbalance(before), routing.Imbalance(after))
	spr := pl.SlotsPerRank()
	for r := range n {
		var es []string
		for s := r * spr; s < (r+1)*spr; s++ {
			if e := pl.SlotExpert(s); e != routing.EmptySlot {
				mark := ""
				if len(pl.Replicas(e)) > 1 {
					mark = fmt.Sprintf("/%d", len(pl.Replicas(e)))
				}
				es = append(es, strconv.Itoa(e)+mark)
			}
		}
		fmt.Fprintf(w, "rank %d: load %.4g, experts %s\n", r, after[r], strings.Join(es, " "))
	}
	fmt.Fprintln(w, "(e/k: expert e, one of its k replicas)")
	return nil
}

// expertLoadLine matches a sample of a2a_moe_expert_load in Prometheus's
// text format.
var expertLoadLine = regexp.MustCompile(`^a2a_moe_expert_load\{([^}]*)\}\s+(\S+)`)

var expertLabel = regexp.MustCompile(`expert="(\d+)"`)

// readLoads reads one load per expert: from a rank's /metrics (an http or
// https URL: the a2a_moe_expert_load samples, the same on every rank of a
// group), from a file in that format, or from a file (or - for standard
// input) of numbers separated by spaces, commas or newlines, expert 0 first.
func readLoads(ctx context.Context, source string) ([]float64, error) {
	var text []byte
	var err error
	switch {
	case strings.HasPrefix(source, "http://") || strings.HasPrefix(source, "https://"):
		text, err = fetch(ctx, source)
	case source == "-":
		text, err = io.ReadAll(os.Stdin)
	default:
		text, err = os.ReadFile(source)
	}
	if err != nil {
		return nil, fmt.Errorf("--moe %s: %w", source, err)
	}
	load, err := parseLoads(string(text))
	if err != nil {
		return nil, usageError{fmt.Errorf("--moe %s: %w", source, err)}
	}
	return load, nil
}

func fetch(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 64<<20))
}

// parseLoads reads the a2a_moe_expert_load samples of a metrics text, or,
// if it has none, a list of numbers.
func parseLoads(text string) ([]float64, error) {
	byExpert := map[int]float64{}
	for _, line := range strings.Split(text, "\n") {
		m := expertLoadLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		e := expertLabel.FindStringSubmatch(m[1])
		v, err := strconv.ParseFloat(m[2], 64)
		if e == nil || err != nil {
			return nil, fmt.Errorf("bad sample %q", line)
		}
		id, _ := strconv.Atoi(e[1])
		byExpert[id] = v
	}
	if len(byExpert) > 0 {
		load := make([]float64, len(byExpert))
		for id, v := range byExpert {
			if id >= len(load) {
				return nil, fmt.Errorf("a2a_moe_expert_load has %d experts but names expert %d", len(load), id)
			}
			load[id] = v
		}
		return load, nil
	}
	var load []float64
	for _, f := range strings.FieldsFunc(text, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' }) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a load (want numbers, or a2a_moe_expert_load samples)", f)
		}
		load = append(load, v)
	}
	if len(load) == 0 || slices.ContainsFunc(load, func(v float64) bool { return !(v >= 0) }) {
		return nil, fmt.Errorf("want one load >= 0 per expert, got %v", load)
	}
	return load, nil
}
