package main

import (
	"bytes"
	"encoding/xml"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// node is an element of the SVG, with its attributes and children.
type node struct {
	name     string
	attr     map[string]string
	text     string // its character data
	children []*node
}

func parseSVG(t *testing.T, svg []byte) *node {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(svg))
	root := &node{name: "document"}
	stack := []*node{root}
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("the SVG is not well-formed XML: %v\n%s", err, svg)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			n := &node{name: tok.Name.Local, attr: map[string]string{}}
			for _, a := range tok.Attr {
				n.attr[a.Name.Local] = a.Value
			}
			top := stack[len(stack)-1]
			top.children = append(top.children, n)
			stack = append(stack, n)
		case xml.CharData:
			stack[len(stack)-1].text += string(tok)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	if len(root.children) != 1 || root.children[0].name != "svg" || root.children[0].attr["xmlns"] != "http://www.w3.org/2000/svg" {
		t.Fatalf("the document is not one svg element in the SVG namespace")
	}
	return root.children[0]
}

// find returns the elements under n (depth first) whose class list has class.
func (n *node) find(class string) []*node {
	var out []*node
	for _, c := range n.children {
		if slices.Contains(strings.Fields(c.attr["class"]), class) {
			out = append(out, c)
		}
		out = append(out, c.find(class)...)
	}
	return out
}

func (n *node) has(class string) bool { return slices.Contains(strings.Fields(n.attr["class"]), class) }

func num(t *testing.T, n *node, key string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(n.attr[key], 64)
	if err != nil {
		t.Fatalf("<%s class=%q>: attribute %s=%q is not a number", n.name, n.attr["class"], key, n.attr[key])
	}
	return v
}

const tableHead = "# medians of 3 rounds of p50 latencies (us); ratio above 1: a2a is faster\n" +
	"tr   ranks op             bytes     ompi_us    mpich_us      a2a_us     heap_us  a2a_algo          ompi/a2a  mpich/a2a  heap/a2a\n"

// cell is a point the plot must draw: its size, the ratio as data-ratio writes it, and
// whether it is marked as under 1.0 or off the scale.
type cell struct {
	bytes    int64
	ratio    string
	under    bool
	offScale bool
}

func TestPlot(t *testing.T) {
	cases := []struct {
		name  string
		table string
		want  map[string]map[string][]cell // panel "op ratio" -> series -> cells, by size
	}{{
		name: "sweep with a 0.5x cell",
		table: tableHead +
			"shm  2     alltoallv          8        0.29        0.85        0.29        0.51  ll                    1.00       2.93      1.76\n" +
			"shm  2     alltoallv        256        0.40        0.80        0.80        0.80  ll                    0.50       1.00      1.00\n" +
			"shm  2     alltoallv       1024        2.20        4.40        1.10        1.10  pairwise              2.00       4.00      1.00\n" +
			"shm  2     alltoallv       4096        2.70        2.70        1.80        1.80  pairwise              1.50       1.50      1.00\n" +
			"tcp  2     alltoallv          8        8.69           -        9.50        7.50  ll                    0.91          -      0.79\n" +
			"tcp  2     alltoallv       4096       54.25           -       33.54       24.43  pairwise              1.62          -      0.73\n" +
			"shm  2     allreduce          8        0.32        1.14        0.62        0.59  ll                    0.25       1.84      0.95\n",
		want: map[string]map[string][]cell{
			"alltoallv ompi/a2a": {
				"shm 2": {{8, "1.00", false, false}, {256, "0.50", true, false}, {1024, "2.00", false, false}, {4096, "1.50", false, false}},
				"tcp 2": {{8, "0.91", true, false}, {4096, "1.62", false, false}},
			},
			"alltoallv mpich/a2a": {
				"shm 2": {{8, "2.93", false, false}, {256, "1.00", false, false}, {1024, "4.00", false, false}, {4096, "1.50", false, false}},
			},
			"allreduce ompi/a2a":  {"shm 2": {{8, "0.25", true, false}}},
			"allreduce mpich/a2a": {"shm 2": {{8, "1.84", false, false}}},
		},
	}, {
		name: "MPICH oversubscribed, off the scale; no MPICH over TCP",
		table: tableHead +
			"shm  4     alltoallv          8        7.03     8005.60        6.08        8.21  ll                    1.16    1316.93      1.35\n" +
			"shm  4     alltoallv      65536       58.95     8063.20       19.37       63.72  fullmesh              3.04     416.29      3.29\n" +
			"tcp  4     alltoallv          8       91.05           -       97.94       82.88  ll                    0.93          -      0.85\n" +
			"tcp  4     alltoallv      65536      441.93           -      170.11      296.20  fullmesh              0.05          -      1.74\n",
		want: map[string]map[string][]cell{
			"alltoallv ompi/a2a": {
				"shm 4": {{8, "1.16", false, false}, {65536, "3.04", false, false}},
				"tcp 4": {{8, "0.93", true, false}, {65536, "0.05", true, true}},
			},
			"alltoallv mpich/a2a": {
				"shm 4": {{8, "1316.93", false, true}, {65536, "416.29", false, true}},
			},
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(nil, strings.NewReader(tc.table), &out); err != nil {
				t.Fatal(err)
			}
			svg := parseSVG(t, out.Bytes())
			panels := svg.find("panel")
			if len(panels) != len(tc.want) {
				t.Fatalf("%d panels, want %d", len(panels), len(tc.want))
			}
			for _, p := range panels {
				key := p.attr["data-op"] + " " + p.attr["data-ratio"]
				want, ok := tc.want[key]
				if !ok {
					t.Errorf("unexpected panel %q", key)
					continue
				}
				checkPanel(t, key, p, want)
			}
		})
	}
}

// checkPanel holds one panel to its cells: a 1.0 line across it, one polyline per series
// through exactly its points, and every point where log2 scales put it.
func checkPanel(t *testing.T, key string, p *node, want map[string][]cell) {
	t.Helper()
	refs := p.find("ref")
	if len(refs) != 1 || refs[0].attr["data-value"] != "1" || num(t, refs[0], "y1") != num(t, refs[0], "y2") {
		t.Fatalf("%s: want one horizontal 1.0 reference line, got %d", key, len(refs))
	}
	ref := num(t, refs[0], "y1")
	top, bottom := padT, padT+plotH
	if ref <= top || ref >= bottom {
		t.Errorf("%s: the 1.0 line at y=%.1f is not inside the plot (%.1f..%.1f)", key, ref, top, bottom)
	}
	band := p.find("under-band")
	if len(band) != 1 || num(t, band[0], "y") != ref {
		t.Errorf("%s: the band under 1.0 does not start at the 1.0 line", key)
	}
	lines := p.find("series")
	if len(lines) != len(want) {
		t.Errorf("%s: %d lines, want %d", key, len(lines), len(want))
	}
	points := p.find("point")
	ax := gridY(t, key, p)
	checkX(t, key, points)
	for _, l := range lines {
		series := l.attr["data-series"]
		cells, ok := want[series]
		if !ok {
			t.Errorf("%s: unexpected line %q", key, series)
			continue
		}
		var mine []*node
		for _, pt := range points {
			if pt.attr["data-series"] == series {
				mine = append(mine, pt)
			}
		}
		xy := strings.Fields(l.attr["points"])
		if len(xy) != len(cells) || len(mine) != len(cells) {
			t.Errorf("%s %s: %d polyline vertices and %d points, want %d", key, series, len(xy), len(mine), len(cells))
			continue
		}
		for i, c := range cells {
			pt := mine[i]
			if pt.attr["data-bytes"] != strconv.FormatInt(c.bytes, 10) || pt.attr["data-ratio"] != c.ratio {
				t.Errorf("%s %s point %d: %s bytes at %s, want %d at %s", key, series, i, pt.attr["data-bytes"], pt.attr["data-ratio"], c.bytes, c.ratio)
			}
			if pt.has("under") != c.under || pt.has("off-scale") != c.offScale {
				t.Errorf("%s %s %d bytes: class %q, want under=%v off-scale=%v", key, series, c.bytes, pt.attr["class"], c.under, c.offScale)
			}
			if vertex := pt.attr["cx"] + "," + pt.attr["cy"]; xy[i] != vertex {
				t.Errorf("%s %s %d bytes: polyline vertex %s, point at %s", key, series, c.bytes, xy[i], vertex)
			}
			checkPosition(t, key+" "+series, pt, c, ref, ax)
		}
	}
}

// yAxis is a panel's vertical scale as its grid draws it: a horizontal line at every
// power of 2 of the ratio.
type yAxis struct {
	top, bottom float64 // the highest and lowest grid lines: the edges of the range
	perDoubling float64 // pixels between neighbouring grid lines
}

func gridY(t *testing.T, key string, p *node) yAxis {
	t.Helper()
	var ys []float64
	for _, g := range p.find("grid") {
		if y := num(t, g, "y1"); y == num(t, g, "y2") {
			ys = append(ys, y)
		}
	}
	slices.Sort(ys)
	if len(ys) < 3 {
		t.Fatalf("%s: %d horizontal grid lines, want one per power of 2 from 0.5x to 2x at least", key, len(ys))
	}
	ax := yAxis{top: ys[0], bottom: ys[len(ys)-1], perDoubling: ys[1] - ys[0]}
	for i := 2; i < len(ys); i++ {
		if math.Abs(ys[i]-ys[i-1]-ax.perDoubling) > 0.15 {
			t.Fatalf("%s: grid lines at %v are not evenly spaced (log2 scale)", key, ys)
		}
	}
	// A 0.5x cell must stand out at a glance: a doubling is at least 20 pixels.
	if ax.perDoubling < 20 {
		t.Errorf("%s: %.1f pixels per doubling of the ratio, want 20 or more", key, ax.perDoubling)
	}
	return ax
}

// checkPosition: a cell lies above the 1.0 line when a2a is faster, below when slower, on
// it at 1.0, as far from it as log2 of its ratio says, or on the range's edge when off
// the scale.
func checkPosition(t *testing.T, where string, pt *node, c cell, ref float64, ax yAxis) {
	t.Helper()
	r, _ := strconv.ParseFloat(c.ratio, 64)
	cy := num(t, pt, "cy")
	want := ref - ax.perDoubling*math.Log2(r)
	switch {
	case c.offScale && r > 1:
		want = ax.top
	case c.offScale:
		want = ax.bottom
	}
	if math.Abs(cy-want) > 0.6 {
		t.Errorf("%s %d bytes: ratio %.2f at y=%.1f, want %.1f (1.0 at %.1f, log2 scale)", where, c.bytes, r, cy, want, ref)
	}
	if (r < 1) != (cy > ref) && r != 1 {
		t.Errorf("%s %d bytes: ratio %.2f on the wrong side of the 1.0 line", where, c.bytes, r)
	}
}

// checkX: along x, the distance between two points is log2 of their sizes' ratio times
// one width per doubling, the same for every line of the panel.
func checkX(t *testing.T, key string, points []*node) {
	t.Helper()
	per := 0.0
	for i := range points {
		for j := range i {
			bi, bj := num(t, points[i], "data-bytes"), num(t, points[j], "data-bytes")
			if bi == bj {
				if num(t, points[i], "cx") != num(t, points[j], "cx") {
					t.Errorf("%s: two points of %.0f bytes at different x", key, bi)
				}
				continue
			}
			d := (num(t, points[i], "cx") - num(t, points[j], "cx")) / math.Log2(bi/bj)
			if per == 0 {
				per = d
			}
			if d <= 0 || math.Abs(d-per) > 0.2 {
				t.Errorf("%s: %.0f and %.0f bytes are %.1f pixels per doubling apart, others %.1f", key, bi, bj, d, per)
			}
		}
	}
}

// TestRunFiles: a table file in, an SVG file out, as compare-mpi.sh --plot runs it; the
// subtitle is escaped.
func TestRunFiles(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "compare.txt"), filepath.Join(dir, "compare.svg")
	table := tableHead + "shm  2     alltoallv        256        0.40        0.80        0.80        0.80  ll                    0.50       1.00      1.00\n"
	if err := os.WriteFile(in, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := run([]string{"-o", out, "-title", "make compare <quick> & co", in}, strings.NewReader(""), &stdout); err != nil {
		t.Fatal(err)
	}
	if stdout.Len() != 0 {
		t.Errorf("wrote %d bytes to standard output with -o", stdout.Len())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	svg := parseSVG(t, data)
	if !bytes.Contains(data, []byte("make compare &lt;quick&gt; &amp; co")) {
		t.Errorf("the subtitle is missing or not escaped")
	}
	if p := svg.find("point"); len(p) != 2 || !p[0].has("under") {
		t.Errorf("want the 0.5x point marked under 1.0 and the MPICH one, got %d points", len(p))
	}
}

// TestErrors: a table the plot cannot read fails with the line that is wrong, and writes
// no file.
func TestErrors(t *testing.T) {
	cases := []struct {
		name, table, want string
	}{
		{"no header", "shm 2 alltoallv 8 1 1 1 1 ll 1.0 1.0 1.0\n", "before the header"},
		{"no ratio column", "tr ranks op bytes a2a_us\nshm 2 alltoallv 8 1\n", `no column "ompi/a2a"`},
		{"short row", tableHead + "shm 2 alltoallv 8 1 1 1 1 ll 1.0 1.0\n", "line 3: 11 fields"},
		{"bad ranks", tableHead + "shm x alltoallv 8 1 1 1 1 ll 1.0 1.0 1.0\n", "ranks"},
		{"bad size", tableHead + "shm 2 alltoallv 0 1 1 1 1 ll 1.0 1.0 1.0\n", "bytes"},
		{"bad ratio", tableHead + "shm 2 alltoallv 8 1 1 1 1 ll 0 1.0 1.0\n", "ompi/a2a"},
		{"nothing to plot", tableHead + "tcp 2 alltoallv 8 1 - 1 1 ll - - 1.0\n", "no ratio to plot"},
		{"empty", "", "no ratio to plot"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "x.svg")
			err := run([]string{"-o", out}, strings.NewReader(tc.table), &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("a failed plot left %s (%v)", out, err)
			}
		})
	}
}

// TestSubtitleWraps: a long subtitle (compare-mpi.sh puts its command line
// there) is cut into lines that fit the picture's width, every word kept in
// order, and the picture grows to make room.
func TestSubtitleWraps(t *testing.T) {
	table := tableHead + "shm  2     alltoallv        256        0.40        0.80        0.80        0.80  ll                    0.50       1.00      1.00\n"
	words := strings.Fields(strings.Repeat("scripts/compare-mpi.sh -r 3 -n 2 -w '' -t shm -o alltoallv ", 8))
	svgOf := func(title string) *node {
		var out bytes.Buffer
		if err := run([]string{"-title", title}, strings.NewReader(table), &out); err != nil {
			t.Fatal(err)
		}
		return parseSVG(t, out.Bytes())
	}
	short, long := svgOf("one line"), svgOf(strings.Join(words, " "))
	lines := long.find("subtitle")
	if len(lines) < 3 {
		t.Fatalf("%d subtitle lines for %d words, want 3 or more", len(lines), len(words))
	}
	var got []string
	for _, l := range lines {
		if w := float64(len(l.text)) * charW; w > num(t, long, "width")-20 {
			t.Errorf("subtitle line %q is about %.0f wide, more than the picture", l.text, w)
		}
		got = append(got, strings.Fields(l.text)...)
	}
	if !slices.Equal(got, words) {
		t.Errorf("subtitle words %q, want %q", got, words)
	}
	if grew := num(t, long, "height") - num(t, short, "height"); grew != subH*float64(len(lines)-1) {
		t.Errorf("the picture grew by %.0f for %d subtitle lines, want %.0f", grew, len(lines), subH*float64(len(lines)-1))
	}
}
