// The live view's MoE panel: what the groups' dispatchers report, drawn as
// SVG. The series are serve's samples of the last minutes (one a second),
// oldest first; ages_s says how long ago each was taken. Uses app.js's
// helpers (el, colour, rgb, bytes, seconds, percent).
"use strict";

const MOE_SPAN_S = 300; // the history serve keeps
const CHART_W = 600;
const LOAD = [[247, 251, 255], [198, 219, 239], [107, 174, 214], [33, 113, 181], [8, 48, 107]];
const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(typeof c === "string" ? document.createTextNode(c) : c);
  }
  return e;
}

// spanOf is the time the charts cover: the history there is, in whole
// minutes, from one to MOE_SPAN_S.
function spanOf(m) {
  const oldest = m.ages_s.length > 0 ? m.ages_s[0] : 0;
  return Math.min(MOE_SPAN_S, Math.max(60, Math.ceil(oldest / 60) * 60));
}

// xOf places a sample of age a (seconds) on a chart of width w covering
// span seconds: now at the right edge.
function xOf(a, w, span) { return w * (1 - Math.min(Math.max(a, 0), span) / span); }

function timeAxis(w, y, span) {
  const g = svg("g", { class: "axis" });
  const step = span <= 60 ? 15 : 60;
  for (let a = span; a >= 0; a -= step) {
    const x = xOf(a, w, span);
    const label = a === 0 ? "now" : a % 60 === 0 ? `-${a / 60}m` : `-${a}s`;
    g.append(svg("line", { x1: x, x2: x, y1: y, y2: y + 4 }),
      svg("text", { x: Math.min(Math.max(x, 12), w - 12), y: y + 15, "text-anchor": "middle" }, label));
  }
  return g;
}

// MAX_ROWS bounds a heatmap's rows: more experts or ranks are drawn in bands
// of consecutive ones, each showing its hottest.
const MAX_ROWS = 64;

// heatmap draws rows (experts or ranks) against time: value(s, r) of sample
// s and row r, coloured on stops relative to the largest.
function heatmap(m, kind, rows, value, stops, rowName, unit) {
  const n = m.ages_s.length;
  const band = Math.ceil(rows / MAX_ROWS);
  if (band > 1) {
    const all = rows, one = value, name = rowName;
    rows = Math.ceil(all / band);
    value = (s, b) => {
      let v = 0;
      for (let r = b * band; r < Math.min((b + 1) * band, all); r++) v = Math.max(v, one(s, r));
      return v;
    };
    rowName = (b) => name(b * band) + "+";
  }
  const rowH = Math.max(2, Math.min(12, Math.floor(180 / Math.max(rows, 1))));
  const h = rows * rowH;
  let top = 0;
  for (let s = 0; s < n; s++) for (let r = 0; r < rows; r++) top = Math.max(top, value(s, r));
  const span = spanOf(m);
  const colW = CHART_W / span + 0.5; // one second, overlapping a little: no seams
  const chart = svg("svg", { class: "heatmap", "data-heatmap": kind, "data-rows": rows, "data-band": band, "data-samples": n,
    viewBox: `-40 0 ${CHART_W + 40} ${h + 20}`, width: "100%", role: "img" });
  for (let r = 0; r < rows; r++) {
    if (rows <= 32 || r % Math.ceil(rows / 16) === 0) {
      chart.append(svg("text", { class: "rowname", x: -4, y: r * rowH + rowH / 2 + 3, "text-anchor": "end" }, rowName(r)));
    }
  }
  let lit = 0;
  for (let s = 0; s < n; s++) {
    const x = xOf(m.ages_s[s], CHART_W, span) - colW;
    for (let r = 0; r < rows; r++) {
      const v = value(s, r);
      if (!(v > 0)) continue;
      lit++;
      chart.append(svg("rect", { x: x.toFixed(1), y: r * rowH, width: colW.toFixed(2), height: rowH,
        fill: rgb(colour(stops, top > 0 ? v / top : 0)) }));
    }
  }
  chart.setAttribute("data-lit", lit);
  chart.append(svg("rect", { class: "frame", x: 0, y: 0, width: CHART_W, height: h }), timeAxis(CHART_W, h, span));
  const legend = el("div", { class: "legend" }, "0",
    el("span", { class: "bar", style: `background:linear-gradient(90deg, ${stops.map(rgb).join(", ")})` }),
    top > 0 ? unit(top) : "nothing yet");
  return [chart, legend];
}

// imbalanceChart draws max/mean rank load over time, measured and as the
// dispatchers estimate it, with a mark at each re-placement.
function imbalanceChart(m) {
  const h = 120, n = m.ages_s.length, span = spanOf(m);
  let top = 1.5;
  for (let s = 0; s < n; s++) top = Math.max(top, m.imbalance[s], m.estimate[s]);
  top = Math.ceil(top * 2) / 2;
  // From a little below 1, so that a balanced layer's line clears the frame.
  const yOf = (v) => h - (h * (v - 0.9)) / (top - 0.9);
  const chart = svg("svg", { class: "timeline", "data-timeline": "imbalance", "data-samples": n,
    viewBox: `-40 0 ${CHART_W + 40} ${h + 20}`, width: "100%", role: "img" });
  for (let v = 1; v <= top + 1e-9; v += 0.5) {
    chart.append(svg("line", { class: "grid", x1: 0, x2: CHART_W, y1: yOf(v), y2: yOf(v) }),
      svg("text", { class: "rowname", x: -4, y: yOf(v) + 3, "text-anchor": "end" }, v.toFixed(1)));
  }
  m.replace_ages_s.forEach((a, i) => {
    const x = xOf(a, CHART_W, span), k = m.replace_counts[i];
    chart.append(svg("line", { class: "replace-mark", "data-age": a.toFixed(1), "data-count": k, x1: x, x2: x, y1: 0, y2: h },
      svg("title", {}, `${k > 1 ? k + " re-placements" : "re-placement"} ${seconds(a)} ago`)));
  });
  const line = (series, cls) => {
    let d = "";
    for (let s = 0; s < n; s++) {
      if (!(series[s] > 0)) continue; // idle or no estimate: a gap
      d += `${d === "" || !(series[s - 1] > 0) ? "M" : "L"}${xOf(m.ages_s[s], CHART_W, span).toFixed(1)},${yOf(series[s]).toFixed(1)}`;
    }
    if (d !== "") chart.append(svg("path", { class: cls, d }));
  };
  line(m.estimate, "estimate");
  line(m.imbalance, "measured");
  chart.append(svg("rect", { class: "frame", x: 0, y: 0, width: CHART_W, height: h }), timeAxis(CHART_W, h, span));
  const key = el("div", { class: "legend" }, el("span", { class: "swatch measured" }), "measured (rows received per rank)",
    el("span", { class: "swatch estimate" }), "dispatchers' estimate", el("span", { class: "swatch replace" }), "re-placement");
  return [chart, key];
}

function quantileRow(name, q) {
  return el("tr", { "data-step": name, "data-steps": q.steps, "data-p50": q.p50_s, "data-p99": q.p99_s },
    el("td", { class: "name" }, name), el("td", { class: "num" }, q.steps.toLocaleString("en")),
    el("td", { class: "num" }, q.steps ? seconds(q.p50_s) : "–"), el("td", { class: "num" }, q.steps ? seconds(q.p99_s) : "–"));
}

function moeSummaryCard(g) {
  const m = g.moe;
  const card = el("div", { class: "card", "data-moe": g.group }, el("h3", {}, "MoE layer"),
    el("p", { class: "sub" }, `${m.experts} experts · ${m.dispatches.toLocaleString("en")} dispatches over the ranks · ` +
      `${m.replacements} re-placement${m.replacements === 1 ? "" : "s"}` +
      (m.replace_bytes ? ` (${bytes(m.replace_bytes)} of parameters moved)` : "")));
  const steps = el("table", { class: "ops moe-steps" },
    el("tr", {}, ...["step", "steps", "p50", "p99"].map((h) => el("th", {}, h))),
    quantileRow("dispatch", m.dispatch), quantileRow("combine", m.combine));
  card.append(el("p", { class: "note" }, "Step time over the last minute, every rank:"), steps);
  const dropped = el("p", { class: "note", "data-dropped": m.dropped },
    "Dropped assignments (experts over capacity): ", el("b", {}, m.dropped.toLocaleString("en")),
    ` in all, ${m.dropped_rate.toFixed(1)}/s lately.`);
  card.append(dropped);
  if (m.wire.length > 0) {
    const wire = el("table", { class: "ops moe-wire" },
      el("tr", {}, ...["wire", "on the wire", "in dtype", "saved"].map((h) => el("th", {}, h))));
    for (const w of m.wire) {
      wire.append(el("tr", { "data-wire": w.format, "data-saved": w.saved_bytes },
        el("td", { class: "name" }, w.format), el("td", { class: "num" }, bytes(w.wire_bytes)),
        el("td", { class: "num" }, bytes(w.dtype_bytes)),
        el("td", { class: "num" }, bytes(w.saved_bytes) + (w.dtype_bytes > 0 ? ` (${percent(w.saved_bytes / w.dtype_bytes)})` : ""))));
    }
    card.append(el("p", { class: "note" }, "Rows sent to other ranks, by wire format:"), wire);
  }
  return card;
}

function moeCards(g) {
  const m = g.moe;
  const cards = [moeSummaryCard(g)];
  const tokens = el("div", { class: "card wide" }, el("h3", {}, "Tokens per expert"),
    el("p", { class: "sub" }, "Rows per second dispatched to each expert (row) over the group, up to the last five minutes."));
  tokens.append(...heatmap(m, "tokens", m.experts, (s, e) => (m.token_rate[s] || [])[e] || 0, TRAFFIC,
    (e) => "e" + e, (v) => v.toFixed(0) + " rows/s"));
  cards.push(tokens);
  const load = el("div", { class: "card wide" }, el("h3", {}, "Rank load"),
    el("p", { class: "sub" }, "Max over mean rows per rank (1 is balanced), with each re-placement marked; below, each rank's load over the mean."));
  load.append(...imbalanceChart(m));
  const rel = (s, r) => {
    const l = m.load[s] || [];
    const mean = l.reduce((a, b) => a + b, 0) / Math.max(l.length, 1);
    return mean > 0 ? (l[r] || 0) / mean : 0;
  };
  load.append(...heatmap(m, "load", g.size, rel, LOAD, (r) => "r" + r, (v) => v.toFixed(2) + "× mean"));
  cards.push(load);
  return cards;
}
