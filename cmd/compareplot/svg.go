package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// The layout, in SVG user units (pixels).
const (
	panelW  = 460.0
	panelH  = 250.0
	headH   = 74.0 // heading, one line of subtitle and legend above the panels
	subH    = 15.0 // each further line of the subtitle
	charW   = 6.3  // the width of a character of the subtitle, about (11 px sans-serif)
	padL    = 56.0 // room for the y labels
	padR    = 24.0 // room for the last size's label
	inset   = 10.0 // the first and last sizes' points stay off the panel's edges
	padT    = 30.0 // the panel's title
	padB    = 40.0 // the x labels and the axis name
	plotW   = panelW - padL - padR
	plotH   = panelH - padT - padB
	minLog2 = -3.0 // the y range never reaches past 1/8x ...
	maxLog2 = 4.0  // ... or 16x: further points sit on its edge
)

// Colours by rank count (the palette repeats past eight), dashes by transport.
var (
	colours = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"}
	dashes  = []string{"", "7 4", "2 3", "9 3 2 3"}
)

// scale maps a size and a ratio to a panel's coordinates: log2 on both axes.
type scale struct {
	xlo, xhi float64 // log2 of the smallest and largest size
	ylo, yhi float64 // log2 of the ratio range
}

func newScale(t *table) scale {
	s := scale{xlo: math.Inf(1), xhi: math.Inf(-1), ylo: -1, yhi: 1}
	for _, r := range t.rows {
		b := math.Log2(float64(r.bytes))
		s.xlo, s.xhi = math.Min(s.xlo, b), math.Max(s.xhi, b)
		for _, name := range t.ratios {
			if v, ok := r.ratio[name]; ok {
				s.ylo = math.Min(s.ylo, math.Floor(math.Log2(v)))
				s.yhi = math.Max(s.yhi, math.Ceil(math.Log2(v)))
			}
		}
	}
	s.ylo, s.yhi = math.Max(s.ylo, minLog2), math.Min(s.yhi, maxLog2)
	return s
}

// x is the horizontal position of a size inside the plot area.
func (s scale) x(bytes int64) float64 {
	if s.xhi == s.xlo {
		return padL + plotW/2
	}
	return padL + inset + (math.Log2(float64(bytes))-s.xlo)/(s.xhi-s.xlo)*(plotW-2*inset)
}

// y is the vertical position of a ratio, and whether it had to be clamped to the range.
func (s scale) y(ratio float64) (float64, bool) {
	l := math.Log2(ratio)
	clamped := l < s.ylo || l > s.yhi
	l = math.Max(s.ylo, math.Min(s.yhi, l))
	return padT + (s.yhi-l)/(s.yhi-s.ylo)*plotH, clamped
}

// svgWriter collects the document in memory; render writes it out in one go.
type svgWriter struct {
	buf bytes.Buffer
}

func (w *svgWriter) printf(format string, a ...any) { fmt.Fprintf(&w.buf, format, a...) }

// text writes a text element with its content escaped.
func (w *svgWriter) text(x, y float64, attrs, s string) {
	w.printf(`<text x="%.1f" y="%.1f" %s>`, x, y, attrs)
	_ = xml.EscapeText(&w.buf, []byte(s))
	w.printf("</text>\n")
}

// render writes the SVG of the table: one panel per operation (rows) and ratio column
// (columns).
func render(out io.Writer, t *table, subtitle string) error {
	ops, keys, s := t.ops(), t.series(), newScale(t)
	width := float64(len(t.ratios)) * panelW
	sub := wrap(subtitle, int((width-20)/charW))
	head := headH + subH*float64(max(len(sub)-1, 0))
	height := head + float64(len(ops))*panelH
	w := &svgWriter{}
	w.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	w.printf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w.text(10, 18, `font-size="14" font-weight="bold"`,
		strings.Join(t.ratios, ", ")+": p50 latency over a2a's, per size per peer (above 1: a2a faster)")
	for i, line := range sub {
		w.text(10, 36+subH*float64(i), `class="subtitle" fill="#444"`, line)
	}
	legend(w, keys, head)
	for i, op := range ops {
		for j, ratio := range t.ratios {
			panel(w, t, s, keys, op, ratio, float64(j)*panelW, head+float64(i)*panelH)
		}
	}
	w.printf("</svg>\n")
	_, err := out.Write(w.buf.Bytes())
	return err
}

// legend draws one swatch per series: its colour, its dash and its name.
func legend(w *svgWriter, keys []seriesKey, head float64) {
	x, y := 10.0, head-16
	for _, k := range keys {
		colour, dash := style(keys, k)
		w.printf(`<line class="legend" data-series="%s" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n",
			attr(k.String()), x, y, x+24, y, colour, dashAttr(dash))
		w.text(x+28, y+4, `class="legend-label"`, k.String()+" ranks")
		x += 100
	}
}

// style is a series' colour (by its rank count) and dash (by its transport).
func style(keys []seriesKey, k seriesKey) (colour, dash string) {
	var trs []string
	var ranks []int
	for _, o := range keys {
		if !slices.Contains(trs, o.tr) {
			trs = append(trs, o.tr)
		}
		if !slices.Contains(ranks, o.ranks) {
			ranks = append(ranks, o.ranks)
		}
	}
	return colours[slices.Index(ranks, k.ranks)%len(colours)], dashes[slices.Index(trs, k.tr)%len(dashes)]
}

func dashAttr(dash string) string {
	if dash == "" {
		return ""
	}
	return fmt.Sprintf(` stroke-dasharray="%s"`, dash)
}

// panel draws one operation's ratio column at (ox, oy): the red band under 1.0, the
// grid, the 1.0 line, then every series' line and points.
func panel(w *svgWriter, t *table, s scale, keys []seriesKey, op, ratio string, ox, oy float64) {
	w.printf(`<g class="panel" data-op="%s" data-ratio="%s" transform="translate(%.1f,%.1f)">`+"\n", attr(op), attr(ratio), ox, oy)
	w.text(padL, padT-10, `font-size="12" font-weight="bold"`, fmt.Sprintf("%s, %s", op, ratio))
	one, _ := s.y(1)
	bottom, _ := s.y(math.Exp2(s.ylo))
	w.printf(`<rect class="under-band" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fde0dc"/>`+"\n", padL, one, plotW, bottom-one)
	grid(w, t, s)
	w.printf(`<line class="ref" data-value="1" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-width="1.5"/>`+"\n", padL, one, padL+plotW, one)
	for _, k := range keys {
		pts := t.line(op, ratio, k)
		if len(pts) == 0 {
			continue
		}
		colour, dash := style(keys, k)
		xy := make([]string, len(pts))
		for i, p := range pts {
			y, _ := s.y(p.ratio)
			xy[i] = fmt.Sprintf("%.1f,%.1f", s.x(p.bytes), y)
		}
		w.printf(`<polyline class="series" data-series="%s" points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n",
			attr(k.String()), strings.Join(xy, " "), colour, dashAttr(dash))
		for _, p := range pts {
			marker(w, s, k, p, colour)
		}
	}
	w.printf("</g>\n")
}

// marker draws one cell: a dot in its series' colour, larger and ringed red under 1.0,
// ringed black when off the scale; its title holds the exact figures. (Values written
// beside the points were tried: at one size the series pile up and their labels overlap.)
func marker(w *svgWriter, s scale, k seriesKey, p point, colour string) {
	x := s.x(p.bytes)
	y, clamped := s.y(p.ratio)
	class, r, ring := "point", 3.0, ""
	switch {
	case p.ratio < 1:
		class, r, ring = "point under", 4.5, ` stroke="#d00000" stroke-width="2"`
	case clamped:
		class, r, ring = "point clamped", 4.5, ` stroke="black" stroke-width="1.5"`
	}
	if clamped {
		class += " off-scale"
	}
	w.printf(`<circle class="%s" data-series="%s" data-bytes="%d" data-ratio="%.2f" cx="%.1f" cy="%.1f" r="%.1f" fill="%s"%s>`,
		class, attr(k.String()), p.bytes, p.ratio, x, y, r, colour, ring)
	w.printf("<title>%s ranks, %s per peer: %.2fx</title></circle>\n", attr(k.String()), sizeLabel(p.bytes), p.ratio)
}

// grid draws a line and a label at every power of 2 of the ratio, and at every size of the
// table along x.
func grid(w *svgWriter, t *table, s scale) {
	for l := s.ylo; l <= s.yhi; l++ {
		y, _ := s.y(math.Exp2(l))
		w.printf(`<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", padL, y, padL+plotW, y)
		w.text(padL-6, y+4, `text-anchor="end"`, ratioLabel(l))
	}
	var sizes []int64
	for _, r := range t.rows {
		if !slices.Contains(sizes, r.bytes) {
			sizes = append(sizes, r.bytes)
		}
	}
	for _, b := range sizes {
		x := s.x(b)
		w.printf(`<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x, padT, x, padT+plotH)
		w.text(x, padT+plotH+14, `text-anchor="middle"`, sizeLabel(b))
	}
	w.text(padL+plotW/2, padT+plotH+30, `text-anchor="middle" fill="#444"`, "bytes per peer (log2)")
}

// ratioLabel names a power of 2 of the ratio: 0.25x, 0.5x, 1x, 2x.
func ratioLabel(l float64) string {
	return fmt.Sprintf("%gx", math.Exp2(l))
}

// sizeLabel writes a size as the table's sweep names it: 8, 256, 1K, 64K, 1M.
func sizeLabel(b int64) string {
	switch {
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dM", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dK", b>>10)
	}
	return fmt.Sprintf("%d", b)
}

// wrap cuts s into lines of at most n characters at spaces (a word longer
// than n gets a line of its own): a subtitle holding a long command line
// stays inside the picture.
func wrap(s string, n int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= n:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// attr escapes a value of the table for an attribute.
func attr(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
