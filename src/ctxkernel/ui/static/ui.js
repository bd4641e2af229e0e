// ctxkernel inspector. No framework, no network beyond this server's /api.
// Session content is untrusted: every element is built with createElement and textContent,
// never innerHTML, and links are built only from validated ids and numbers.
"use strict";

const body = document.body;
const BASE = body.dataset.base || "";
const CSRF = body.dataset.csrf || "";
const POLL_MS = Math.max(500, parseInt(body.dataset.pollMs || "2000", 10));
const SVG_NS = "http://www.w3.org/2000/svg";
const SESSION_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

// -- helpers ------------------------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function sessionUrl(id) {
  // only ids of the kernel's own shape become links; anything else is shown as text
  return SESSION_ID.test(id) ? `${BASE}/sessions/${encodeURIComponent(id)}` : null;
}

function fmt(n) {
  return typeof n === "number" ? n.toLocaleString("en-US") : n === null || n === undefined ? "–" : String(n);
}

function pct(ratio) {
  return typeof ratio === "number" ? `${(ratio * 100).toFixed(1)}%` : "–";
}

async function getJSON(path) {
  const response = await fetch(`${BASE}${path}`, { headers: { Accept: "application/json" }, credentials: "same-origin" });
  const data = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

function replace(container, ...children) {
  container.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}

function gauge(pressure) {
  const meter = el("meter", { min: 0, max: 1, low: 0.7, high: 0.9, optimum: 0.2, value: Math.min(1, pressure.ratio || 0), class: "gauge" });
  const label = el("span", { class: "gauge-text", text: `${fmt(pressure.tokens)} / ${fmt(pressure.effective_window)} (${pct(pressure.ratio)})` });
  return el("span", { class: "gauge-wrap", title: pressure.anchored ? "anchored on provider usage" : "estimated" }, meter, " ", label);
}

// -- Sessions page ------------------------------------------------------------------------------
function sessionsPage() {
  const tbody = document.querySelector("#sessions tbody");
  const search = document.getElementById("search");
  const status = document.getElementById("status");
  const count = document.getElementById("count");
  let rows = [];
  let sortKey = "last_activity";
  let sortDir = -1;
  const summaries = new Map();

  function value(row, key) {
    const s = summaries.get(row.id) || row.summary;
    if (key === "pressure") return s ? s.pressure.ratio : -1;
    if (key === "windows") return s && s.windows !== null ? s.windows : -1;
    if (key === "compactions") return s ? s.compactions : -1;
    return row[key];
  }

  function render() {
    const needle = search.value.trim();
    const shown = rows.filter((r) => !needle || r.id.includes(needle));
    shown.sort((a, b) => {
      const x = value(a, sortKey);
      const y = value(b, sortKey);
      return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
    });
    count.textContent = `${shown.length} of ${rows.length} sessions`;
    replace(tbody, ...shown.map((row) => {
      const s = summaries.get(row.id) || row.summary;
      const url = sessionUrl(row.id);
      const idCell = url ? el("a", { href: url, class: "session-link" }, row.id) : row.id;
      const parentId = row.parent || (s && s.parent);
      const parent = parentId ? el("div", { class: "muted continues" }, "continues ", sessionUrl(parentId) ? el("a", { href: sessionUrl(parentId) }, parentId) : parentId) : null;
      const origin = row.origin ? el("div", { class: "muted origin", text: row.origin }) : null;
      if (row.error) return el("tr", { "data-session": row.id, class: "broken" }, el("td", {}, idCell), el("td", { colspan: 6, class: "error", text: row.error }));
      return el("tr", { "data-session": row.id },
        el("td", {}, idCell, parent),
        el("td", {}, (s && s.profile) || row.profile || "–", origin),
        el("td", { text: row.last_activity || "–" }),
        el("td", { class: "num events", text: fmt(row.events) }),
        el("td", { class: "num pressure" }, s ? gauge(s.pressure) : el("span", { class: "muted", text: "…" })),
        el("td", { class: "num windows", text: s ? fmt(s.windows) : "…" }),
        el("td", { class: "num compactions", text: s ? fmt(s.compactions) : "…" }),
      );
    }));
  }

  async function fillSummaries() {
    // one at a time: each may replay a session the first time it is asked for
    for (const row of rows) {
      if (summaries.has(row.id) || row.summary || row.error) continue;
      try {
        summaries.set(row.id, await getJSON(`/api/sessions/${encodeURIComponent(row.id)}/summary`));
      } catch (err) {
        status.textContent = `${row.id}: ${err.message}`;
      }
      render();
    }
    status.textContent = status.textContent || "";
  }

  async function load() {
    try {
      const data = await getJSON("/api/sessions");
      rows = data.sessions;
      for (const row of rows) if (row.summary) summaries.set(row.id, row.summary);
      render();
      await fillSummaries();
    } catch (err) {
      status.textContent = `could not list sessions: ${err.message}`;
    }
  }

  for (const th of document.querySelectorAll("#sessions th[data-key]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.key;
      sortDir = key === sortKey ? -sortDir : 1;
      sortKey = key;
      for (const other of document.querySelectorAll("#sessions th")) other.removeAttribute("aria-sort");
      th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      render();
    });
  }
  search.addEventListener("input", render);
  load();
}

// -- Session page: pieces --------------------------------------------------------------------------
function card(label, value, id) {
  return el("div", { class: "card" }, el("div", { class: "card-label", text: label }), el("div", { class: "card-value", id }, value));
}

function renderOverview(view) {
  const p = view.pressure;
  const s = view.surface;
  const roles = Object.entries(s.roles).map(([role, n]) => `${n} ${role}`).join(", ");
  replace(document.getElementById("overview"),
    card("pressure", gauge(p), "pressure"),
    card("tokens", fmt(p.tokens), "pressure-tokens"),
    card("cached prefix", view.cache && view.cache.prefix_tokens != null ? `${fmt(view.cache.prefix_tokens)} tokens` : "none yet", "cache-prefix"),
    card("effective window", fmt(p.effective_window), "effective-window"),
    card("events", fmt(view.events), "events-count"),
    card("turn", fmt(view.turn), "turn"),
    card("surface", `${fmt(s.nodes)} messages, ${fmt(s.tokens)} tokens`, "surface-summary"),
    card("roles", roles || "empty", "surface-roles"),
    card("compactions", fmt(view.compactions.length), "compactions-count"),
    card("profile", view.profile, "profile"),
    ...(view.origin ? [card("origin", view.origin, "origin")] : []),
    ...(view.parent ? [card("continues", sessionUrl(view.parent) ? el("a", { href: sessionUrl(view.parent) }, view.parent) : view.parent, "parent")] : []),
  );
}

function renderTimeline(t) {
  const box = document.getElementById("timeline");
  const legend = document.getElementById("timeline-legend");
  const width = 960, height = 300, left = 70, right = 20, top = 16, bottom = 30;
  const plotW = width - left - right, plotH = height - top - bottom;
  // one point per request; past a bound, per bucket of `t.width` requests (its peak prompt tokens,
  // drawn at the bucket's middle, with a band down to its lowest)
  const total = t.request_count;
  const points = t.requests.map((r) => ({ i: r.request + (r.count - 1) / 2, tokens: r.tokens, low: r.tokens_min, window: r.window || t.effective_window }));
  const measured = points.filter((p) => typeof p.tokens === "number");
  const windows = points.map((p) => p.window).filter((w) => typeof w === "number");
  const topValue = Math.max(1, t.effective_window || 0, ...windows, ...measured.map((p) => p.tokens));
  const yMax = topValue * 1.08;
  const n = Math.max(2, total);
  const x = (i) => left + (plotW * i) / (n - 1);
  const y = (v) => top + plotH - (plotH * v) / yMax;
  const chart = svg("svg", { id: "timeline-chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": "prompt tokens per request" });
  chart.append(svg("rect", { x: left, y: top, width: plotW, height: plotH, class: "plot" }));
  for (let k = 0; k <= 4; k++) {
    const v = (yMax * k) / 4;
    chart.append(svg("line", { x1: left, x2: left + plotW, y1: y(v), y2: y(v), class: "grid" }));
    chart.append(svg("text", { x: left - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, Math.round(v).toLocaleString("en-US")));
  }
  chart.append(svg("text", { x: left + plotW / 2, y: height - 6, class: "tick", "text-anchor": "middle" }, `request (${total})`));
  if (points.length) {
    chart.append(svg("polyline", { class: "window-line", points: points.map((p) => `${x(p.i)},${y(p.window)}`).join(" ") }));
  } else {
    chart.append(svg("line", { class: "window-line", x1: left, x2: left + plotW, y1: y(t.effective_window), y2: y(t.effective_window) }));
  }
  for (const th of t.thresholds) {
    const v = th.ratio * t.effective_window;
    chart.append(svg("line", { class: "threshold", x1: left, x2: left + plotW, y1: y(v), y2: y(v), "data-setting": th.setting }));
    chart.append(svg("text", { x: left + 4, y: y(v) - 3, class: "tick threshold-label" }, `${th.strategy} ${th.setting} ${th.ratio}`));
  }
  for (const m of t.markers) {
    const mx = x(Math.min(Math.max(0, m.request - 0.5), n - 1));
    const line = svg("line", { class: `marker marker-${m.kind}`, x1: mx, x2: mx, y1: top, y2: top + plotH });
    line.append(svg("title", {}, `${m.label} (event ${m.seq})`));
    chart.append(line);
  }
  if (measured.length && t.width > 1) {
    const band = measured.map((p) => `${x(p.i)},${y(p.tokens)}`).concat(measured.slice().reverse().map((p) => `${x(p.i)},${y(p.low)}`));
    chart.append(svg("polygon", { class: "tokens-band", points: band.join(" ") }));
  }
  if (measured.length) {
    chart.append(svg("polyline", { class: "tokens-line", points: measured.map((p) => `${x(p.i)},${y(p.tokens)}`).join(" ") }));
  }
  replace(box, chart);
  const kinds = {};
  for (const m of t.markers) kinds[m.kind] = (kinds[m.kind] || 0) + 1;
  replace(legend,
    el("li", { class: "lg-tokens", text: `prompt tokens (${fmt(t.measured)} of ${fmt(total)} requests report usage${t.width > 1 ? `; a point is the peak of ${fmt(t.width)} requests, the band their range` : ""})` }),
    el("li", { class: "lg-window", text: `effective window ${fmt(t.effective_window)}` }),
    ...t.thresholds.map((th) => el("li", { class: "lg-threshold", text: `${th.strategy}.${th.setting} = ${th.ratio} (${fmt(Math.round(th.ratio * t.effective_window))} tokens)` })),
    ...Object.entries(kinds).map(([kind, k]) => el("li", { class: `lg-marker marker-${kind}`, text: `${kind}: ${k}` })),
  );
}

function seqLink(seq, label) {
  const a = el("a", { href: `#event-${seq}`, class: "seq-link", "data-seq": seq }, label === undefined ? String(seq) : label);
  a.addEventListener("click", (e) => {
    e.preventDefault();
    showLogAt(seq);
  });
  return a;
}

function renderSurface(surface) {
  const table = el("table", { id: "surface-table" },
    el("thead", {}, el("tr", {}, ...["seq", "role", "source", "tokens", "decay", "replaces", "content"].map((h) => el("th", { text: h })))));
  const tbody = el("tbody");
  for (const node of surface.nodes) {
    const source = [node.source.kind, node.source.plugin, node.source.form].filter(Boolean).join("/");
    const decay = node.decay ? [node.decay.anchor, node.decay.kind, node.decay.tier !== undefined ? `tier ${node.decay.tier}` : null].filter(Boolean).join(" · ") : "";
    const replaces = node.replaces
      ? el("span", {}, `${node.replaces.op} of ${node.replaces.count} events: `, seqLink(node.replaces.first), "…", seqLink(node.replaces.last))
      : "";
    const calls = node.tool_calls.length ? el("div", { class: "muted", text: `calls ${node.tool_calls.map((c) => c.name).join(", ")}` }) : null;
    const first = node.text.text.split("\n")[0].slice(0, 160);
    const more = node.text.chars > node.text.text.length ? ` … (${fmt(node.text.chars)} characters)` : "";
    const content = el("details", { class: "message" }, el("summary", { text: first || "(empty)" }), el("pre", { text: node.text.text + more }));
    tbody.append(el("tr", { class: `role-${node.role}`, "data-seq": node.seq },
      el("td", {}, seqLink(node.seq)), el("td", { text: node.role }), el("td", { text: source }),
      el("td", { class: "num", text: fmt(node.tokens) }), el("td", { text: decay }), el("td", {}, replaces),
      el("td", {}, content, calls)));
  }
  table.append(tbody);
  replace(document.getElementById("surface"), el("p", { class: "muted", text: `${surface.nodes.length} messages, ${fmt(surface.tokens)} tokens` }), table);
}

function valueView(value) {
  if (value === null || value === undefined) return el("span", { class: "muted", text: "–" });
  if (Array.isArray(value)) {
    if (value.length && value.every((v) => v && typeof v === "object" && !Array.isArray(v))) return tableOf(value);
    return el("span", { text: value.map((v) => (typeof v === "object" ? JSON.stringify(v) : String(v))).join(", ") || "(none)" });
  }
  if (typeof value === "object") return kvTable(value);
  if (typeof value === "number") return el("span", { text: fmt(value) });
  return el("span", { text: String(value) });
}

function tableOf(items) {
  const keys = [...new Set(items.flatMap((i) => Object.keys(i)))];
  return el("table", { class: "panel-table" },
    el("thead", {}, el("tr", {}, ...keys.map((k) => el("th", { text: k })))),
    el("tbody", {}, ...items.slice(0, 500).map((item) => el("tr", {}, ...keys.map((k) => el("td", {}, cellView(item[k])))))));
}

function cellView(value) {
  // nested records stay folded inside a table cell, so rows keep one line each
  if (value && typeof value === "object" && (!Array.isArray(value) || value.some((v) => v && typeof v === "object"))) {
    const size = Array.isArray(value) ? value.length : Object.keys(value).length;
    return el("details", { class: "cell" }, el("summary", { text: `${size} ${Array.isArray(value) ? "items" : "fields"}` }), valueView(value));
  }
  return valueView(value);
}

function kvTable(obj) {
  return el("table", { class: "kv" }, el("tbody", {}, ...Object.entries(obj).map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", {}, valueView(v))))));
}

const PANEL_ORDER = { decay: ["pressure", "blocks", "positions"] };

function renderStrategies(panels) {
  const sections = Object.entries(panels).map(([name, panel]) => {
    const section = el("section", { class: "strategy", "data-strategy": name }, el("h3", { text: name }));
    if (!panel || typeof panel !== "object") {
      section.append(valueView(panel));
      return section;
    }
    // lists first by name where a strategy has a preferred order, the rest as they come
    const keys = [...(PANEL_ORDER[name] || []).filter((k) => k in panel), ...Object.keys(panel).filter((k) => !(PANEL_ORDER[name] || []).includes(k))];
    for (const key of keys) {
      const value = panel[key];
      const heavy = Array.isArray(value) && value.length && typeof value[0] === "object";
      if (heavy || (value && typeof value === "object" && !Array.isArray(value))) {
        section.append(el("details", { open: heavy && value.length <= 50 ? "" : null, class: `panel-${key}` }, el("summary", { text: `${key} (${Array.isArray(value) ? value.length : Object.keys(value).length})` }), valueView(value)));
      } else {
        section.append(el("div", { class: "kv-line" }, el("span", { class: "kv-key", text: `${key}: ` }), valueView(value)));
      }
    }
    return section;
  });
  replace(document.getElementById("strategies"), ...(sections.length ? sections : [el("p", { class: "muted", text: "no strategy panels" })]));
}

function renderTransactions(data) {
  const txns = data.transactions;
  if (!txns.length) {
    replace(document.getElementById("transactions"), el("p", { class: "muted", text: "no compaction transactions" }));
    return;
  }
  const head = ["started", "strategy", "kind", "outcome", "tokens", "replaced", "ended", "error"];
  replace(document.getElementById("transactions"), el("table", { id: "transactions-table" },
    el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { text: h })))),
    el("tbody", {}, ...txns.slice().reverse().map((t) => el("tr", { class: `outcome-${t.outcome}` },
      el("td", {}, seqLink(t.start), " ", el("span", { class: "muted", text: t.time })),
      el("td", { text: t.strategy }), el("td", { text: t.kind || "–" }), el("td", { class: "outcome", text: t.outcome }),
      el("td", { class: "num", text: t.tokens_before !== null ? `${fmt(t.tokens_before)} → ${fmt(t.tokens_after)}` : "–" }),
      el("td", { class: "num", text: fmt(t.cites) }),
      el("td", {}, t.end !== null ? seqLink(t.end) : "–"),
      el("td", { text: t.error || "" }))))));
}

// -- the log (paged; never the whole log) -------------------------------------------------------------
const logState = { start: null, limit: 100, types: "", page: null, session: "" };

// a row's data is fetched when it is opened: a page of folded rows sends only their previews
async function fillEvent(details, seq) {
  if (details.dataset.loaded) return;
  details.dataset.loaded = "pending";
  const pre = details.querySelector("pre");
  try {
    const event = await getJSON(`/api/sessions/${encodeURIComponent(logState.session)}/events/${seq}`);
    const more = event.data.chars > event.data.text.length ? `\n… (${fmt(event.data.chars)} characters in all)` : "";
    pre.textContent = event.data.text + more;
    details.dataset.loaded = "yes";
  } catch (err) {
    pre.textContent = `could not load event ${seq}: ${err.message}`;
    delete details.dataset.loaded;
  }
}

function renderLog(page) {
  logState.page = page;
  document.getElementById("log-range").textContent = page.rows.length
    ? `events ${fmt(page.start)}–${fmt(page.end - 1)} of ${fmt(page.events)}${page.types.length ? ` (${page.rows.length} matching ${page.types.join(", ")})` : ""}`
    : `no events in ${fmt(page.start)}–${fmt(page.end)} of ${fmt(page.events)}`;
  const list = el("div", { id: "log-rows" });
  for (const row of page.rows) {
    const details = el("details", { class: "event", id: `event-${row.seq}`, "data-seq": row.seq, "data-type": row.type },
      el("summary", {}, el("span", { class: "seq", text: row.seq }), " ", el("span", { class: "type", text: row.type }), " ",
        el("span", { class: "muted", text: row.time }), " ", el("span", { class: "preview", text: row.preview })),
      row.surface ? el("div", { class: "muted", text: `surface ${JSON.stringify(row.surface)}` }) : null,
      el("pre", { text: "loading…" }));
    details.addEventListener("toggle", () => { if (details.open) fillEvent(details, row.seq); });
    list.append(details);
  }
  replace(document.getElementById("log"), list);
  document.getElementById("log-prev").disabled = page.previous === null;
  document.getElementById("log-next").disabled = page.next === null;
}

async function loadLog(sessionId) {
  logState.session = sessionId;
  const params = new URLSearchParams({ limit: String(logState.limit) });
  if (logState.start !== null) params.set("start", String(logState.start));
  if (logState.types) params.set("type", logState.types);
  renderLog(await getJSON(`/api/sessions/${encodeURIComponent(sessionId)}/log?${params}`));
}

let showLogAt = () => {};

// -- Session page ----------------------------------------------------------------------------------------
function sessionPage() {
  const id = body.dataset.session;
  const q = encodeURIComponent(id);
  const live = document.getElementById("live");
  let seen = -1;
  let busy = false;

  showLogAt = async (seq) => {
    logState.start = Math.max(0, seq);
    await loadLog(id);
    const target = document.getElementById(`event-${seq}`);
    if (target) {
      target.open = true;
      target.scrollIntoView({ block: "center" });
    }
  };

  async function loadAll() {
    const [view, timeline, surface, transactions] = await Promise.all([
      getJSON(`/api/sessions/${q}`), getJSON(`/api/sessions/${q}/timeline`),
      getJSON(`/api/sessions/${q}/surface`), getJSON(`/api/sessions/${q}/transactions`),
    ]);
    renderOverview(view);
    renderTimeline(timeline);
    renderSurface(surface);
    renderStrategies(view.strategies);
    renderTransactions(transactions);
    if (logState.start === null) await loadLog(id); // following the end of the log
    seen = view.events;
    body.dataset.events = String(view.events);
    live.textContent = `live: ${fmt(view.events)} events, checked ${new Date().toLocaleTimeString()}`;
  }

  async function poll() {
    if (busy) return;
    busy = true;
    try {
      const head = await getJSON(`/api/sessions/${q}/head`);
      if (head.events !== seen) await loadAll();
      else live.textContent = `live: ${fmt(seen)} events, checked ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      live.textContent = `update failed: ${err.message}`;
    } finally {
      busy = false;
    }
  }

  document.getElementById("log-apply").addEventListener("click", () => {
    logState.types = document.getElementById("log-types").value.trim();
    logState.start = logState.types ? 0 : null;
    loadLog(id);
  });
  document.getElementById("log-first").addEventListener("click", () => { logState.start = 0; loadLog(id); });
  document.getElementById("log-last").addEventListener("click", () => {
    // the end of the whole log, followed live (a filtered view pages forward from its start)
    logState.start = null;
    logState.types = "";
    document.getElementById("log-types").value = "";
    loadLog(id);
  });
  document.getElementById("log-prev").addEventListener("click", () => {
    if (logState.page && logState.page.previous !== null) { logState.start = logState.page.previous; loadLog(id); }
  });
  document.getElementById("log-next").addEventListener("click", () => {
    if (logState.page && logState.page.next !== null) { logState.start = logState.page.next; loadLog(id); }
  });

  if (body.dataset.actions === "on") setUpActions(id, loadAll);
  busy = true;
  loadAll().catch((err) => { live.textContent = `could not load: ${err.message}`; }).finally(() => { busy = false; });
  setInterval(poll, POLL_MS);
}

async function setUpActions(id, reload) {
  const panel = document.getElementById("actions-panel");
  const box = document.getElementById("actions");
  const result = document.getElementById("action-result");
  const q = encodeURIComponent(id);
  const post = async (label, path, button) => {
    button.disabled = true;
    try {
      const response = await fetch(`${BASE}/api/sessions/${q}/${path}`, {
        method: "POST", credentials: "same-origin", headers: { "X-CSRF-Token": CSRF, Accept: "application/json" },
      });
      const answer = await response.json();
      result.textContent = response.ok
        ? `${label}: ${answer.ok ? "done" : "not done"}: ${answer.detail} (${answer.events_written} events written)`
        : `${label}: ${answer.error}`;
      await reload();
      await render();
    } catch (err) {
      result.textContent = `${label}: ${err.message}`;
    } finally {
      button.disabled = false;
    }
  };
  const render = async () => {
    const data = await getJSON(`/api/sessions/${q}/actions`);
    panel.hidden = false;
    const items = [];
    for (const [name, info] of Object.entries(data.actions)) {
      if (info.available) {
        const label = name === "compact" ? "Compact now" : name === "archive" ? "Archive now" : name;
        const button = el("button", { type: "button", id: `action-${name}` }, `${label} (${info.strategies.join(", ")})`);
        button.addEventListener("click", () => post(name, `actions/${encodeURIComponent(name)}`, button));
        items.push(button);
      } else {
        items.push(el("p", { class: "muted", text: `${name}: ${info.why}` }));
      }
    }
    const rows = data.strategies.map((s) => {
      const toggle = s.enabled ? "disable" : "enable";
      const button = el("button", { type: "button", id: `toggle-${s.name}` }, `${toggle === "enable" ? "Enable" : "Disable"} ${s.name}`);
      button.addEventListener("click", () => post(`${toggle} ${s.name}`, `strategies/${encodeURIComponent(s.name)}/${toggle}`, button));
      return el("li", { class: "strategy-toggle", "data-strategy": s.name, "data-enabled": String(s.enabled) },
        el("span", { text: `${s.name}: ${s.enabled ? "enabled" : "disabled"} for this session ` }), button);
    });
    items.push(el("ul", { id: "strategy-toggles" }, ...rows));
    replace(box, ...items);
  };
  await render();
}

if (body.dataset.page === "sessions") sessionsPage();
else if (body.dataset.page === "session") sessionPage();
