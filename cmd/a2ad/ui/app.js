// The a2a live view: polls api/groups and draws, per group, the traffic
// and wait matrices as HTML tables, the algorithm mix, the MoE layer (SVG
// charts, moe.js) and the membership.
// Every value from the server goes through textContent, never HTML.
"use strict";

const POLL_MS = 1000;
const MAX_MATRIX = 64; // larger groups: see the JSON or the Grafana heatmap

// Colour scales as stops from 0 to 1 (viridis for bytes, a white-to-red
// ramp for waiting).
const TRAFFIC = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const WAIT = [[255, 247, 236], [253, 212, 158], [252, 141, 89], [215, 48, 31], [127, 0, 0]];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c !== null && c !== undefined) e.append(c);
  }
  return e;
}

function colour(stops, t) {
  t = Math.min(Math.max(t, 0), 1) * (stops.length - 1);
  const i = Math.min(Math.floor(t), stops.length - 2);
  const f = t - i;
  return stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * f));
}

function rgb(c) { return `rgb(${c[0]},${c[1]},${c[2]})`; }

// Dark text on light cells, white on dark ones.
function ink(c) { return (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) > 150 ? "#1d2330" : "#fff"; }

function bytes(n, perSecond) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let u = 0;
  while (n >= 1000 && u < units.length - 1) { n /= 1000; u++; }
  const v = n >= 100 || u === 0 ? n.toFixed(0) : n.toFixed(1);
  return v + " " + units[u] + (perSecond ? "/s" : "");
}

function seconds(s) {
  if (s < 0) return "–";
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  return (s / 60).toFixed(0) + " min";
}

function percent(x) { return x >= 0.1 ? (x * 100).toFixed(0) + "%" : (x * 100).toFixed(1) + "%"; }

// hostColour gives each host of a group its own hue, for the chips.
function hostColour(h) { return `hsl(${(h * 137) % 360}, 55%, 50%)`; }

function shortHost(id) { return id.split("/")[0]; }

// matrix draws one heatmap: rows are the rank that sends (or waits), columns
// the peer. value(i, j) in [0, max] picks the colour, label and title the text.
function matrix(g, kind, value, label, title, stops) {
  const n = g.size;
  let max = 0;
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) if (i !== j) max = Math.max(max, value(i, j));
  const cellW = n <= 8 ? 68 : n <= 16 ? 44 : 14;
  const cellH = n <= 16 ? 30 : 14;
  const showText = n <= 16;
  const table = el("table", { class: "matrix", "data-matrix": kind, "data-group": g.group });
  const head = el("tr", {}, el("th", { class: "corner" }, kind === "traffic" ? "from \\ to" : "waits on →"));
  for (let j = 0; j < n; j++) head.append(el("th", {}, String(j)));
  table.append(el("thead", {}, head));
  const body = el("tbody");
  for (let i = 0; i < n; i++) {
    const rank = g.ranks[i];
    const chip = el("span", { class: "hostchip", style: `background:${hostColour(rank ? rank.host : 0)}` });
    const row = el("tr", {}, el("th", { title: rank ? "host " + g.hosts[rank.host] : "" }, chip, "rank " + i));
    for (let j = 0; j < n; j++) {
      const v = i === j ? 0 : value(i, j);
      const attrs = { class: "cell", "data-matrix": kind, "data-from": i, "data-to": j, "data-value": v,
        style: `width:${cellW}px;height:${cellH}px` };
      if (kind === "traffic") {
        attrs["data-bytes"] = g.traffic.sent[i][j] + g.traffic.local[i][j];
        attrs["data-local"] = g.traffic.local[i][j];
      }
      if (i === j) {
        attrs.class += " self";
        attrs.title = `rank ${i} itself`;
        row.append(el("td", attrs, showText ? "—" : ""));
        continue;
      }
      const c = colour(stops, max > 0 ? v / max : 0);
      attrs.style += `;background:${rgb(c)};color:${ink(c)}`;
      attrs.title = title(i, j);
      row.append(el("td", attrs, showText ? label(v) : ""));
    }
    body.append(row);
  }
  table.append(body);
  const legend = el("div", { class: "legend" }, "0",
    el("span", { class: "bar", style: `background:linear-gradient(90deg, ${stops.map(rgb).join(", ")})` }),
    max > 0 ? label(max) : "no traffic yet");
  return [table, legend];
}

// trafficCard draws what each pair exchanged in both classes: through the
// data plane (network, or the shm transport) and "local", the rows the MoE
// dispatcher moves through shared memory outside it.
function trafficCard(g) {
  const t = g.traffic;
  const card = el("div", { class: "card" }, el("h3", {}, "Traffic matrix"),
    el("p", { class: "sub" }, "Bytes per second each rank (row) sends each peer (column), over the last report interval: " +
      "the data plane's and, class local, the MoE rows moved through shared memory."));
  const rateOf = (i, j) => t.sent_rate[i][j] + t.local_rate[i][j];
  const [table, legend] = matrix(g, "traffic", rateOf, (v) => bytes(v, true),
    (i, j) => `rank ${i} → rank ${j}: ${bytes(rateOf(i, j), true)} lately (${bytes(t.local_rate[i][j], true)} of it local), ` +
      `${bytes(t.sent[i][j] + t.local[i][j])} since the group formed (${bytes(t.local[i][j])} local)`,
    TRAFFIC);
  card.append(table, legend);
  let total = 0, rate = 0, local = 0, localRate = 0;
  for (let i = 0; i < g.size; i++) {
    for (let j = 0; j < g.size; j++) {
      total += t.sent[i][j] + t.local[i][j]; rate += rateOf(i, j);
      local += t.local[i][j]; localRate += t.local_rate[i][j];
    }
  }
  card.append(el("p", { class: "note", "data-local-total": local },
    `All ranks together: ${bytes(rate, true)} now, ${bytes(total)} since the group formed` +
    (local > 0 ? `; of them local (shared memory): ${bytes(localRate, true)} now, ${bytes(local)} in all.` : ".")));
  return card;
}

function waitCard(g) {
  const t = g.traffic;
  const card = el("div", { class: "card" }, el("h3", {}, "Wait matrix"),
    el("p", { class: "sub" }, "Share of the last interval each rank (row) spent waiting for a peer's data (column): the peer that arrived last."));
  const [table, legend] = matrix(g, "wait", (i, j) => t.wait_share[i][j], percent,
    (i, j) => `rank ${i} waited on rank ${j}: ${percent(t.wait_share[i][j])} of the last interval, ` +
      `${seconds(t.wait_s[i][j])} since the group formed, last to arrive in ${t.last[i][j]} operations`,
    WAIT);
  card.append(table, legend);
  // The slow rank is the one the others wait on: the column with the most.
  let worst = -1, worstSum = 0, worstTotal = -1, worstTotalSum = 0;
  for (let j = 0; j < g.size; j++) {
    let s = 0, tot = 0;
    for (let i = 0; i < g.size; i++) if (i !== j) { s += t.wait_share[i][j]; tot += t.wait_s[i][j]; }
    if (s > worstSum) { worst = j; worstSum = s; }
    if (tot > worstTotalSum) { worstTotal = j; worstTotalSum = tot; }
  }
  const others = Math.max(g.size - 1, 1);
  if (worst >= 0) {
    card.append(el("p", { class: "note" }, "Waited on most: ", el("span", { class: "slow" }, "rank " + worst),
      ` (the others spend ${percent(worstSum / others)} of their time waiting for it on average).`));
  } else if (worstTotal >= 0) {
    card.append(el("p", { class: "note" }, `Nobody is waiting now. Since the group formed, rank ${worstTotal} was waited on most ` +
      `(${seconds(worstTotalSum)} in all).`));
  }
  return card;
}

function opsCard(g) {
  const ops = g.traffic.ops;
  const card = el("div", { class: "card" }, el("h3", {}, "Algorithm mix"),
    el("p", { class: "sub" }, "Operations since the group formed, by algorithm (calls of the busiest rank)."));
  if (ops.length === 0) {
    card.append(el("p", { class: "note" }, "No operation yet."));
    return card;
  }
  let sum = 0;
  for (const o of ops) sum += o.calls;
  const table = el("table", { class: "ops", "data-ops": g.group });
  for (const o of ops) {
    const share = sum > 0 ? o.calls / sum : 0;
    table.append(el("tr", { "data-op": o.op, "data-algo": o.algo, "data-calls": o.calls },
      el("td", { class: "name" }, o.op), el("td", { class: "name" }, o.algo),
      el("td", { class: "num" }, o.calls.toLocaleString("en")),
      el("td", { class: "num" }, percent(share)),
      el("td", { class: "barcell" }, el("div", { class: "bar", style: `width:${(share * 100).toFixed(1)}%` }))));
  }
  card.append(table);
  return card;
}

function membersCard(g) {
  // Two columns wide: seven columns of figures do not fit a third of the
  // window at 1400 px.
  const card = el("div", { class: "card wide" }, el("h3", {}, "Membership"),
    el("p", { class: "sub" }, `${g.ranks.length} of ${g.size} ranks on ${g.hosts.length} host${g.hosts.length === 1 ? "" : "s"}; ` +
      "how long ago each rank's last heartbeat and traffic report came."));
  const table = el("table", { class: "members", "data-members": g.group });
  table.append(el("tr", {}, ...["rank", "host", "pid", "state", "heartbeat", "report", "errors"].map((h) => el("th", {}, h))));
  for (const r of g.ranks) {
    table.append(el("tr", { "data-rank": r.rank, "data-state": r.state },
      el("td", {}, r.rank >= 0 ? String(r.rank) : "?"),
      el("td", { class: "host", title: g.hosts[r.host] }, el("span", { class: "hostchip", style: `background:${hostColour(r.host)}` }),
        el("span", { class: "hostname" }, `${r.host}: ${shortHost(g.hosts[r.host])}`)),
      el("td", { class: "num" }, String(r.pid)),
      el("td", {}, el("span", { class: "state " + r.state }, r.state)),
      el("td", { class: "num" }, seconds(r.heartbeat_age_s)),
      el("td", { class: "num" }, r.report_age_s < 0 ? "none" : seconds(r.report_age_s)),
      el("td", { class: "num" }, String(r.errors))));
  }
  card.append(table);
  return card;
}

function groupSection(g) {
  let badge = el("span", { class: "badge" }, "formed");
  if (g.forming) badge = el("span", { class: "badge forming" }, "forming");
  if (g.aborted) badge = el("span", { class: "badge aborted" }, "aborted");
  const section = el("section", { class: "group", "data-group": g.group },
    el("h2", {}, "group " + g.group, badge,
      el("span", { class: "meta" }, `${g.size} ranks · ${g.hosts.length} host${g.hosts.length === 1 ? "" : "s"}` +
        (g.epoch ? ` · epoch ${g.epoch}` : "") + (g.pending_counts ? ` · ${g.pending_counts} counts exchanges pending` : ""))));
  const cards = el("div", { class: "cards" });
  if (g.traffic && g.size <= MAX_MATRIX) {
    cards.append(trafficCard(g), waitCard(g));
  } else if (g.traffic) {
    cards.append(el("div", { class: "card" }, el("h3", {}, "Matrices"),
      el("p", { class: "note" }, `${g.size} ranks are too many to draw here (at most ${MAX_MATRIX}); api/groups has the figures.`)));
  } else if (!g.forming) {
    cards.append(el("div", { class: "card" }, el("h3", {}, "Traffic"),
      el("p", { class: "note" }, "No traffic report yet: the ranks report once they exchange data (unless A2A_REPORT is negative).")));
  }
  if (g.traffic) cards.append(opsCard(g));
  if (g.moe) cards.append(...moeCards(g));
  cards.append(membersCard(g));
  section.append(cards);
  return section;
}

function render(state) {
  const root = document.getElementById("groups");
  const sections = state.groups.map(groupSection);
  if (sections.length === 0) {
    sections.push(el("p", { class: "empty" }, "No group is using this control plane right now."));
  }
  root.replaceChildren(...sections);
  // Mark the cards whose content is wider than they are (they scroll
  // sideways): the layout is meant to fit, and the tests look for these.
  for (const card of root.querySelectorAll(".card")) {
    card.dataset.overflows = String(card.scrollWidth > card.clientWidth + 1);
  }
}

function setStatus(ok, text) {
  const s = document.getElementById("status");
  s.dataset.ok = ok ? "true" : "false";
  s.textContent = text;
}

// moeHistory keeps each group's MoE series between polls, since serve sends
// only what it sampled after the last answer's moe_cursor. Keyed by group
// and epoch, as serve's own history is; times in ms of serve's clock.
const moeHistory = new Map();
let moeCursor = "";

// mergeMoE adds the samples of state's (partial) MoE series to moeHistory,
// forgets what is older than serve keeps, and puts the whole history back
// into state, ages counted from state.time, so that moe.js draws it as if
// serve had sent it all.
function mergeMoE(state) {
  const now = Date.parse(state.time), live = new Set();
  const series = ["token_rate", "load", "imbalance", "estimate"];
  for (const g of state.groups) {
    const m = g.moe;
    if (!m) continue;
    const key = `${g.group}@${g.epoch}`;
    live.add(key);
    let h = moeHistory.get(key);
    if (!h || !m.partial) {
      h = { at: [], token_rate: [], load: [], imbalance: [], estimate: [], marks: [] };
      moeHistory.set(key, h);
    }
    m.ages_s.forEach((a, s) => {
      h.at.push(now - a * 1000);
      for (const k of series) h[k].push(m[k][s]);
    });
    m.replace_ages_s.forEach((a, i) => h.marks.push({ at: now - a * 1000, n: m.replace_counts[i] }));
    const cut = now - m.keep_s * 1000;
    let old = 0;
    while (old < h.at.length && h.at[old] < cut) old++;
    for (const k of ["at", ...series]) h[k].splice(0, old);
    h.marks = h.marks.filter((k) => k.at >= cut);
    m.ages_s = h.at.map((t) => (now - t) / 1000);
    for (const k of series) m[k] = h[k];
    m.replace_ages_s = h.marks.map((k) => (now - k.at) / 1000);
    m.replace_counts = h.marks.map((k) => k.n);
  }
  for (const key of moeHistory.keys()) if (!live.has(key)) moeHistory.delete(key);
  moeCursor = state.moe_cursor;
}

async function poll() {
  try {
    const since = moeCursor ? "?since=" + encodeURIComponent(moeCursor) : "";
    const res = await fetch("api/groups" + since, { cache: "no-store" });
    if (!res.ok) throw new Error(`${res.status} ${res.statusText}`);
    const state = await res.json();
    mergeMoE(state);
    render(state);
    const n = state.groups.length;
    setStatus(true, `${n} group${n === 1 ? "" : "s"} · updated ${new Date(state.time).toLocaleTimeString("en-GB")}`);
  } catch (e) {
    setStatus(false, "a2ad not reachable: " + e.message);
  }
  setTimeout(poll, POLL_MS);
}

poll();
