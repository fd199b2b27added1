package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// row is one line of the table: a case and its ratios.
type row struct {
	tr    string
	ranks int
	op    string
	bytes int64
	ratio map[string]float64 // by column name; a "-" cell is absent
}

// table is what the plot needs of compare-mpi.sh's output.
type table struct {
	ratios []string // the plotted ratio columns that have a value somewhere, in the order asked
	rows   []row
}

// parseTable reads compare-mpi.sh's table: comment lines (#), a header line naming the
// columns, then one row per case. Columns are found by name, so a table with more or
// fewer columns (heap_us came later) still reads.
func parseTable(r io.Reader, want []string) (*table, error) {
	sc := bufio.NewScanner(r)
	var col map[string]int
	tab := &table{}
	seen := map[string]bool{}
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if f[0] == "tr" {
			c, err := header(f, want)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			col = c
			continue
		}
		if col == nil {
			return nil, fmt.Errorf("line %d: a row before the header line (tr ranks op bytes ...)", line)
		}
		rw, err := parseRow(f, col, want)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		for name := range rw.ratio {
			seen[name] = true
		}
		tab.rows = append(tab.rows, rw)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, name := range want {
		if seen[name] {
			tab.ratios = append(tab.ratios, name)
		}
	}
	if len(tab.ratios) == 0 {
		return nil, errors.New("no ratio to plot: the table has no row with a value in " + strings.Join(want, ", "))
	}
	return tab, nil
}

// header maps the column names to their positions, and checks that those the plot
// needs are there.
func header(f []string, want []string) (map[string]int, error) {
	col := map[string]int{}
	for i, name := range f {
		col[name] = i
	}
	for _, name := range append([]string{"tr", "ranks", "op", "bytes"}, want...) {
		if _, ok := col[name]; !ok {
			return nil, fmt.Errorf("the header has no column %q", name)
		}
	}
	return col, nil
}

func parseRow(f []string, col map[string]int, want []string) (row, error) {
	if n := len(col); len(f) != n {
		return row{}, fmt.Errorf("%d fields, the header has %d", len(f), n)
	}
	rw := row{tr: f[col["tr"]], op: f[col["op"]], ratio: map[string]float64{}}
	var err error
	if rw.ranks, err = strconv.Atoi(f[col["ranks"]]); err != nil || rw.ranks < 1 {
		return row{}, fmt.Errorf("ranks %q is not a positive count", f[col["ranks"]])
	}
	if rw.bytes, err = strconv.ParseInt(f[col["bytes"]], 10, 64); err != nil || rw.bytes < 1 {
		return row{}, fmt.Errorf("bytes %q is not a positive size", f[col["bytes"]])
	}
	for _, name := range want {
		s := f[col[name]]
		if s == "-" {
			continue
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || !(v > 0) {
			return row{}, fmt.Errorf("%s %q is not a positive ratio", name, s)
		}
		rw.ratio[name] = v
	}
	return rw, nil
}

// ops are the operations in the order the table first shows them.
func (t *table) ops() []string {
	var ops []string
	for _, r := range t.rows {
		if !slices.Contains(ops, r.op) {
			ops = append(ops, r.op)
		}
	}
	return ops
}

// seriesKey names one line of the plot: a transport and a rank count ("shm 4").
type seriesKey struct {
	tr    string
	ranks int
}

func (k seriesKey) String() string { return fmt.Sprintf("%s %d", k.tr, k.ranks) }

// series are the lines of the whole plot in a fixed order (transports as the table first
// shows them, then rank counts up), so a line keeps its colour and dash in every panel.
func (t *table) series() []seriesKey {
	var trs []string
	var keys []seriesKey
	for _, r := range t.rows {
		if !slices.Contains(trs, r.tr) {
			trs = append(trs, r.tr)
		}
		if k := (seriesKey{r.tr, r.ranks}); !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.SortStableFunc(keys, func(a, b seriesKey) int {
		if c := slices.Index(trs, a.tr) - slices.Index(trs, b.tr); c != 0 {
			return c
		}
		return a.ranks - b.ranks
	})
	return keys
}

// point is one cell of a line.
type point struct {
	bytes int64
	ratio float64
}

// line is one series' cells of one operation and ratio column, by size.
func (t *table) line(op, ratio string, k seriesKey) []point {
	var pts []point
	for _, r := range t.rows {
		v, ok := r.ratio[ratio]
		if ok && r.op == op && r.tr == k.tr && r.ranks == k.ranks {
			pts = append(pts, point{r.bytes, v})
		}
	}
	slices.SortStableFunc(pts, func(a, b point) int { return cmp.Compare(a.bytes, b.bytes) })
	return pts
}
