// flexgate's operator dashboard: polls the gateway's JSON API and draws plain SVG.
// No build step and no third-party code. The token lives in sessionStorage only.
"use strict";

const FAST_S = 2; // site and events: what an operator watches during an event
const SLOW_EVERY = 5; // jobs, plan, nodes, sync: every 5th fast round (10 s)
const QUOTE_EVERY = 15; // the supply curve: every 15th round (30 s)
const EVENTS_SHOWN = 200; // the last events by start the timeline and table show
const HISTORY_S = 6 * 3600; // the longest chart span kept in the page
const TOKEN_KEY = "flexgate.token";
const SVG = "http://www.w3.org/2000/svg";

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  round: 0,
  site: null,
  events: [],
  jobs: [],
  pfi: new Map(), // job id -> its PFI in force, its error and source (GET /v1/jobs `pfi`)
  plan: null,
  nodes: [],
  sync: null,
  power: [], // {t, meter, model, target, baseline}
  order: [], // {t, r1, r2, r3}
  sortKey: "id",
  sortUp: true,
  quoteWindowS: null, // the window of the last quote asked on the page; the curve follows it
};

const $ = (id) => document.getElementById(id);

// ---- the API ----------------------------------------------------------------------------

function detailText(detail) {
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
  }
  return JSON.stringify(detail);
}

async function api(path, options = {}) {
  const headers = { Accept: "application/json" };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const answer = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
    cache: "no-store",
  });
  const text = await answer.text();
  let doc = null;
  try {
    doc = text ? JSON.parse(text) : null;
  } catch (_) {
    doc = { detail: text };
  }
  if (!answer.ok) {
    const why = doc && doc.detail !== undefined ? detailText(doc.detail) : answer.statusText;
    throw new Error(`${answer.status}: ${why}`);
  }
  return doc;
}

// ---- formatting --------------------------------------------------------------------------

function num(value, digits = 1) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const text = Number(value).toFixed(digits);
  // A value that rounds to zero is zero: "-0.0 kW" shed reads as a load added.
  return /^-0(\.0*)?$/.test(text) ? text.slice(1) : text;
}

function clock(iso) {
  return iso ? new Date(iso).toLocaleTimeString([], { hour12: false }) : "–";
}

function ago(iso) {
  if (!iso) return "never";
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  return s < 90 ? `${Math.max(0, Math.round(s))} s ago` : `${Math.round(s / 60)} min ago`;
}

function duration(s) {
  if (s <= 0) return "0 s";
  if (s < 120) return `${Math.round(s)} s`;
  return s < 7200 ? `${Math.round(s / 60)} min` : `${(s / 3600).toFixed(1)} h`;
}

function setText(id, text) {
  $(id).textContent = text;
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

// ---- SVG charts ---------------------------------------------------------------------------

function svgNode(name, attributes, text) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

const PAD = { left: 52, right: 12, top: 10, bottom: 24 };

function scale(domain, range) {
  const [d0, d1] = domain;
  const [r0, r1] = range;
  const k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
  return (v) => r0 + (v - d0) * k;
}

function niceTicks(lo, hi, count) {
  const step0 = (hi - lo) / Math.max(1, count);
  const magnitude = 10 ** Math.floor(Math.log10(step0 || 1));
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => s >= step0) || magnitude;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(v);
  return ticks;
}

const TIME_STEPS_S = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];

function xTicks(xDomain, count = 6) {
  if (!xDomain.time) return niceTicks(xDomain[0], xDomain[1], count);
  const wanted = (xDomain[1] - xDomain[0]) / count;
  const step = TIME_STEPS_S.find((s) => s >= wanted) || 3 * 3600;
  const ticks = [];
  for (let t = Math.ceil(xDomain[0] / step) * step; t <= xDomain[1]; t += step) ticks.push(t);
  return ticks;
}

// series: [{cls, points: [[x, y], ...]}]; vlines: [{cls, x}]; xLabel(x) and yLabel(y) format
// the axes (y: a plain number unless given).
function lineChart(svg, { series, xDomain, yDomain, xLabel, yLabel, vlines = [], marks = [] }) {
  const [, , width, height] = svg.getAttribute("viewBox").split(" ").map(Number);
  svg.replaceChildren();
  const x = scale(xDomain, [PAD.left, width - PAD.right]);
  const y = scale(yDomain, [height - PAD.bottom, PAD.top]);
  for (const v of niceTicks(yDomain[0], yDomain[1], 4)) {
    const [left, right] = [PAD.left, width - PAD.right];
    svg.appendChild(svgNode("line", { x1: left, x2: right, y1: y(v), y2: y(v), class: "grid" }));
    const label = yLabel ? yLabel(v) : num(v, v % 1 ? 1 : 0);
    svg.appendChild(svgNode("text", { x: left - 6, y: y(v) + 4, class: "tick end" }, label));
  }
  for (const v of xTicks(xDomain)) {
    const label = svgNode("text", { x: x(v), y: height - 6, class: "tick middle" }, xLabel(v));
    // A label at the right edge ends there rather than being cut off.
    if (x(v) > width - PAD.right - 20) label.style.textAnchor = "end";
    svg.appendChild(label);
  }
  for (const line of vlines) {
    const at = x(line.x);
    const bottom = height - PAD.bottom;
    svg.appendChild(svgNode("line", { x1: at, x2: at, y1: PAD.top, y2: bottom, class: `v ${line.cls}` }));
  }
  for (const s of series) {
    const points = s.points.filter(([, v]) => v !== null && v !== undefined);
    if (points.length === 0) continue;
    const d = points.map(([px, py], i) => `${i ? "L" : "M"}${x(px).toFixed(1)},${y(py).toFixed(1)}`).join("");
    svg.appendChild(svgNode("path", { d, class: `series ${s.cls}` }));
  }
  for (const mark of marks) svg.appendChild(mark(x, y));
}

function span(values, floor) {
  const finite = values.filter((v) => v !== null && v !== undefined && Number.isFinite(v));
  if (finite.length === 0) return [0, 1];
  let lo = Math.min(...finite);
  let hi = Math.max(...finite);
  if (floor !== undefined) lo = Math.min(lo, floor);
  const margin = (hi - lo) * 0.08 || Math.abs(hi) * 0.1 || 1;
  return [floor !== undefined && lo >= floor ? floor : lo - margin, hi + margin];
}

function timeDomain(from, to) {
  const domain = [from, to];
  domain.time = true; // ticks on whole seconds, minutes or hours
  return domain;
}

function timeLabel(seconds) {
  const parts = { hour12: false, hour: "2-digit", minute: "2-digit" };
  if (seconds <= 600) parts.second = "2-digit";
  return (t) => new Date(t * 1000).toLocaleTimeString([], parts);
}

function timeAxis(seconds) {
  const now = Date.now() / 1000;
  return { xDomain: timeDomain(now - seconds, now), xLabel: timeLabel(seconds) };
}

function emptyNote(svg, note) {
  const [, , width, height] = svg.getAttribute("viewBox").split(" ").map(Number);
  svg.appendChild(svgNode("text", { x: width / 2, y: height / 2, class: "tick middle" }, note));
}

// ---- panels ------------------------------------------------------------------------------

function delivered(event, site) {
  const loop = site.tracking || {};
  if (loop.active && loop.event_id === event.id && loop.measured_facility_kw !== null
      && loop.target_facility_kw !== null) {
    return loop.target_facility_kw + loop.requested_reduction_kw - loop.measured_facility_kw;
  }
  return site.baseline_facility_kw - site.meter.facility_power_kw;
}

function modelKw(site) {
  return site.overhead.static_kw + site.overhead.k * site.gpu_power_kw;
}

function drawSite() {
  const site = state.site;
  const loop = site.tracking || {};
  setText("site-meter-kw", num(site.meter.facility_power_kw));
  const fault = site.meter.fault ? `, fault: ${site.meter.fault}` : "";
  setText("site-meter-source", `${site.meter.source}${fault}`);
  setText("site-model-kw", num(modelKw(site)));
  setText("site-target-kw", loop.active ? num(loop.target_facility_kw) : "–");
  setText("site-baseline-kw", num(site.baseline_facility_kw));
  setText("site-shed-kw", num(site.shed_facility_kw));
  setText("site-gpu-kw", num(site.gpu_power_kw));
  setText("loop-target-kw", num(loop.target_facility_kw));
  setText("loop-measured-kw", num(loop.measured_facility_kw));
  setText("loop-error-kw", num(loop.error_kw));
  setText("loop-correction-kw", num(loop.correction_kw));
  const why = loop.reason ? ` (${loop.reason})` : "";
  setText("loop-verdict", loop.active ? `${loop.verdict || "–"}${why}` : "idle");

  const seconds = Number($("span").value);
  const axis = timeAxis(seconds);
  const shown = state.power.filter((p) => p.t >= axis.xDomain[0]);
  const pick = (key) => shown.map((p) => [p.t, p[key]]);
  lineChart($("power-chart"), {
    ...axis,
    yDomain: span(shown.flatMap((p) => [p.meter, p.model, p.target, p.baseline]), 0),
    series: ["baseline", "target", "model", "meter"].map((key) => ({ cls: key, points: pick(key) })),
  });
}

function drawActiveEvent() {
  const site = state.site;
  const event = state.events.find((e) => e.id === site.active_event_id);
  const box = $("active-event");
  if (!event) {
    box.textContent = !site.recovering ? "none"
      : site.recovering_from_event_id ? `none: caps stepping back after ${site.recovering_from_event_id}`
      // Released at start, whatever a previous run left on the agents: no event to name.
        : "none: caps stepping back to the GPUs' own limits since the gateway started";
    return;
  }
  const left = (new Date(event.end).getTime() - Date.now()) / 1000;
  box.textContent = `${event.id} from ${event.source}: ${num(event.reduction_kw)} kW asked, `
    + `opted ${event.opt}${event.reason ? ` (${event.reason})` : ""}, ${duration(left)} left`;
}

function drawEvents() {
  const site = state.site;
  const sorted = [...state.events].sort((a, b) => b.start.localeCompare(a.start));
  drawTimeline();
  fillSettlementChoices(sorted);
  // Rows are redrawn only when they change, so a button is not replaced under the pointer;
  // the delivered figures move every update and are written into the rows as they stand.
  const rows = $("events-rows");
  const signature = JSON.stringify(sorted.map(({ delivery, ...rest }) => rest));
  if (rows.dataset.signature !== signature) {
    rows.dataset.signature = signature;
    rows.replaceChildren(...sorted.map(eventRow));
  }
  const byId = new Map(sorted.map((e) => [e.id, e]));
  for (const row of rows.children) {
    const event = byId.get(row.dataset.eventId);
    const cellNode = row.querySelector("td.delivered");
    const [value, note] = deliveredCell(event, site);
    cellNode.textContent = value;
    cellNode.title = note;
  }
}

// The active event: the cut at the meter now. Any other: its mean over the time the site loop
// read the meter during it, as the gateway stored it.
function deliveredCell(event, site) {
  if (event.id === site.active_event_id) return [num(delivered(event, site)), "now, at the meter"];
  const kept = event.delivery;
  if (!kept) return ["–", "not measured: the site loop did not read a meter during it"];
  return [
    num(kept.delivered_kw),
    `mean over ${duration(kept.measured_s)} at ${kept.meter_source}, `
      + `${num(kept.requested_kw)} kW asked, ${num(kept.delivered_kwh)} kWh shed`,
  ];
}

function eventRow(event) {
  const row = document.createElement("tr");
  row.dataset.eventId = event.id;
  row.className = event.status;
  cell(row, event.id, "id");
  cell(row, event.source);
  cell(row, event.status, "status");
  cell(row, clock(event.start));
  cell(row, clock(event.end));
  cell(row, num(event.reduction_kw), "requested");
  cell(row, "", "delivered");
  cell(row, event.opt, "opt");
  cell(row, event.reason || "", "reason");
  const actions = cell(row, "");
  if (event.status !== "pending") {
    const button = document.createElement("button");
    button.textContent = "Settlement";
    button.className = "settle";
    button.addEventListener("click", () => showSettlement(event.id));
    actions.appendChild(button);
  }
  if (event.status === "pending" || event.status === "active") {
    const button = document.createElement("button");
    button.textContent = "Cancel…";
    button.className = "cancel";
    button.addEventListener("click", () => cancelEvent(event.id));
    actions.appendChild(button);
  }
  return row;
}

function drawTimeline() {
  const seconds = Number($("span").value);
  const now = Date.now() / 1000;
  const xDomain = timeDomain(now - seconds, now + seconds / 3);
  const shown = state.events.filter((e) => new Date(e.end).getTime() / 1000 > xDomain[0]);
  const svg = $("events-chart");
  const lanes = Math.max(1, Math.min(4, shown.length));
  const marks = shown.map((event, i) => (x, y) => {
    const g = svgNode("g", { class: `bar ${event.status} opt-${event.opt}` });
    const x0 = Math.max(x(xDomain[0]), x(new Date(event.start).getTime() / 1000));
    const x1 = Math.min(x(xDomain[1]), x(new Date(event.end).getTime() / 1000));
    const top = y(1 - (i % lanes) / lanes);
    const height = (y(0) - y(1)) / lanes - 2;
    g.appendChild(svgNode("rect", { x: x0, y: top, width: Math.max(2, x1 - x0), height }));
    const label = `${event.id} ${num(event.reduction_kw)} kW ${event.status}`;
    g.appendChild(svgNode("text", { x: x0 + 4, y: top + height / 2 + 4 }, label));
    return g;
  });
  lineChart(svg, {
    xDomain,
    yDomain: [0, 1],
    xLabel: timeLabel(seconds),
    series: [],
    vlines: [{ cls: "now", x: now }],
    marks,
  });
  svg.querySelectorAll(".tick.end").forEach((t) => t.remove());
}

function jobRows() {
  const caps = new Map(((state.plan && state.plan.jobs) || []).map((j) => [j.id, j]));
  return state.jobs.map((job) => {
    const cap = caps.get(job.id);
    const inForce = state.pfi.get(job.id)
      || { pfi: job.pfi, source: job.pfi === undefined ? "default" : "declared", pfi_stderr: job.pfi_stderr };
    return {
      id: job.id,
      cap_w: cap ? cap.cap_w : null,
      kept: cap ? cap.throughput_fraction : 1,
      pfi: inForce.pfi,
      pfi_source: inForce.source,
      pfi_stderr: inForce.pfi_stderr,
      tier: job.tier || "",
      gpus: job.gpus,
      nodes: (job.placement || []).map((p) => p.node).join(", "),
    };
  });
}

function drawJobs() {
  const rows = jobRows();
  const key = state.sortKey;
  const sign = state.sortUp ? 1 : -1;
  rows.sort((a, b) => {
    const [u, v] = [a[key], b[key]];
    if (u === v) return 0;
    if (u === null || u === undefined) return 1;
    if (v === null || v === undefined) return -1;
    return (typeof u === "number" ? u - v : String(u).localeCompare(String(v))) * sign;
  });
  const body = $("jobs-rows");
  body.replaceChildren();
  for (const job of rows) {
    const row = document.createElement("tr");
    row.dataset.jobId = job.id;
    cell(row, job.id);
    cell(row, job.cap_w === null ? "uncapped" : num(job.cap_w), "cap");
    cell(row, `${num(job.kept * 100)} %`, "kept");
    cell(row, num(job.pfi, 2), "pfi");
    cell(row, job.pfi_source, "pfi-source");
    cell(row, job.pfi_stderr === null || job.pfi_stderr === undefined ? "–" : `± ${num(job.pfi_stderr, 2)}`);
    cell(row, job.tier);
    cell(row, String(job.gpus));
    cell(row, job.nodes);
    body.appendChild(row);
  }
  document.querySelectorAll("#jobs th").forEach((th) => {
    th.classList.toggle("sorted", th.dataset.key === key);
    th.classList.toggle("down", th.dataset.key === key && !state.sortUp);
  });
}

function drawNodes() {
  const commands = new Map(((state.plan && state.plan.commands) || []).map((c) => [c.node, c]));
  const body = $("nodes-rows");
  body.replaceChildren();
  for (const node of state.nodes) {
    const row = document.createElement("tr");
    row.dataset.node = node.node;
    row.className = node.reachable ? "" : "unreachable";
    cell(row, node.node);
    // Simulated GPUs stand out: their caps reach no real GPU.
    cell(row, node.backend === "sim" ? "sim (simulated GPUs)" : node.backend || "–",
      `backend ${node.backend || "unknown"}`);
    cell(row, node.reachable ? "yes" : `no: ${node.unreachable_reason || "unknown"}`, "reachable");
    cell(row, ago(node.last_seen));
    const delay = node.actuation_delay;
    cell(row, delay ? `${num(delay.p50_s, 3)} / ${num(delay.p99_s, 3)}` : "–");
    const command = commands.get(node.node);
    const caps = new Map(((command && command.caps) || []).map((c) => [c.gpu, c.cap_w]));
    const enforced = new Map(((command && command.enforced) || []).map((c) => [c.gpu, c.enforced_w]));
    const gpus = node.gpus.map((g) => {
      const cap = caps.has(g.index) ? num(caps.get(g.index), 0) : "none";
      const limit = enforced.has(g.index) ? num(enforced.get(g.index), 0) : "–";
      return `${g.index}: ${num(g.power_w, 0)} / ${cap} / ${limit}`;
    });
    cell(row, gpus.join("  ·  ") || "no telemetry", "gpus");
    body.appendChild(row);
  }
}

function drawSync() {
  const sync = state.sync;
  const verdict = $("sync-verdict");
  verdict.textContent = sync.verdict;
  verdict.className = `badge ${sync.verdict}`;
  const order = sync.order_parameters;
  setText("sync-r1", order ? num(order.r1, 3) : "–");
  setText("sync-r2", order ? num(order.r2, 3) : "–");
  setText("sync-r3", order ? num(order.r3, 3) : "–");
  // r1-r3 measure how aligned the jobs' phases are now; the verdict judges whether the loops'
  // delays can pull them together. Both can hold at once: say which is which.
  setText("sync-order-note", !order ? "no job has reported a phase yet"
    : order.jobs < 2 ? `one job reports a phase: its order parameters are 1 by definition`
      : `${order.jobs} jobs' phases; near 1 means aligned now, near 0 spread`);
  setText("sync-verdict-note", {
    safe: "safe: no loop's delay makes the jobs attract one another",
    "at-risk": "at risk: a loop attracts the jobs, below the coupling that would lock them",
    unsafe: "unsafe: a loop attracts the jobs strongly enough to lock them",
  }[sync.verdict] || "");
  const alarms = sync.alarms || {};
  setText("sync-alarms", alarms.harmonics && alarms.harmonics.length
    ? `harmonic(s) ${alarms.harmonics.join(", ")} locked (${alarms.test})`
    : alarms.test ? `none (${alarms.test} test)` : alarms.note || "none");
  const body = $("loops-rows");
  body.replaceChildren();
  for (const loop of sync.loops) {
    const row = document.createElement("tr");
    row.dataset.loop = loop.name;
    cell(row, loop.name);
    cell(row, num(loop.delay_s, 3), "delay");
    cell(row, loop.max_safe_delay_s === null ? "none needed" : num(loop.max_safe_delay_s, 3), "bound");
    // A loop that acts on several jobs couples them; safe still, when its delay keeps every
    // significant harmonic from attracting.
    cell(row, !loop.couples_jobs ? "no"
      : loop.verdict === "safe" ? "yes, without attraction (delay below the bound)" : "yes", "couples");
    cell(row, loop.verdict, `verdict ${loop.verdict}`);
    body.appendChild(row);
  }
  drawOscillation(sync.oscillation);
  const axis = timeAxis(Number($("span").value));
  const shown = state.order.filter((p) => p.t >= axis.xDomain[0]);
  lineChart($("sync-chart"), {
    ...axis,
    yDomain: [0, 1],
    series: [["meter", "r1"], ["model", "r2"], ["target", "r3"]].map(([cls, key]) => ({
      cls,
      points: shown.map((p) => [p.t, p[key]]),
    })),
  });
  if (shown.length === 0) emptyNote($("sync-chart"), "no job has reported a phase yet");
}

// The site's power swing in the grid's band, per source, as far as each can see it.
function drawOscillation(osc) {
  const badge = $("osc-alarm");
  const body = $("osc-rows");
  body.replaceChildren();
  if (!osc) {
    badge.textContent = "–";
    setText("osc-note", "not checked yet");
    return;
  }
  badge.textContent = osc.alarm ? "alarm" : "ok";
  badge.className = `badge ${osc.alarm ? "unsafe" : "safe"}`;
  const [low, high] = osc.band_hz;
  setText("osc-note", osc.limit_kw === null
    ? `band ${low}-${high} Hz; no limit set (FLEXGATE_OSCILLATION_LIMIT_KW)`
    : `band ${low}-${high} Hz; limit ${num(osc.limit_kw, 3)} kW RMS`
      + (osc.alarm ? `: above it at ${osc.alarm_sources.join(", ")}` : ""));
  for (const name of ["meter", "agents"]) {
    const seen = osc[name];
    const row = document.createElement("tr");
    row.dataset.source = name;
    cell(row, name);
    cell(row, seen.sample_period_s === null ? "–" : num(seen.sample_period_s, 3));
    if (seen.rms_kw === null) {
      const why = cell(row, seen.reason, "reason");
      why.colSpan = 3;
    } else {
      cell(row, seen.band_observed_hz.map((v) => num(v, 2)).join("-"));
      cell(row, num(seen.rms_kw, 3), "rms");
      cell(row, seen.swings.map((s) => s.swing_kw === null ? `${num(s.period_s, 2)} s: –`
        : `${num(s.period_s, 2)} s: ${num(s.swing_kw, 3)}`).join(", ") || "–");
    }
    body.appendChild(row);
  }
}

function drawQuote(quote) {
  setText("flex-expected-kw", num(quote.achievable_kw));
  setText("flex-firm-kw", num(quote.firm_kw));
  setText("flex-window-s", num(quote.window_s, 0));
  setText("flex-confidence", num(quote.confidence, 2));
  const curve = quote.supply_curve.map((p) => [p.facility_kw, p.throughput_loss_fraction * 100]);
  lineChart($("supply-chart"), {
    xDomain: [0, Math.max(1, quote.achievable_kw * 1.05)],
    yDomain: span(curve.map(([, v]) => v), 0),
    xLabel: (v) => `${num(v, 0)} kW`,
    yLabel: (v) => `${num(v, v % 1 ? 1 : 0)} %`,
    series: [{ cls: "meter", points: curve }],
    vlines: [{ cls: "target", x: quote.achievable_kw }, { cls: "baseline", x: quote.firm_kw }],
  });
}

// ---- polling -----------------------------------------------------------------------------

function remember(series, point) {
  series.push(point);
  while (series.length && series[0].t < point.t - HISTORY_S) series.shift();
}

async function fast() {
  // The last EVENTS_SHOWN events (the list grows with every event ever received), and the
  // active one should it be older than those.
  const [site, events] = await Promise.all([
    api("/v1/site"), api(`/v1/events?limit=${EVENTS_SHOWN}`),
  ]);
  const active = site.active_event_id;
  if (active && !events.events.some((e) => e.id === active)) {
    events.events.unshift(await api(`/v1/events/${encodeURIComponent(active)}`));
  }
  const previousPlan = state.site && activePlanId();
  state.site = site;
  state.events = events.events;
  const loop = site.tracking || {};
  remember(state.power, {
    t: Date.now() / 1000,
    meter: site.meter.facility_power_kw,
    model: modelKw(site),
    target: loop.active ? loop.target_facility_kw : null,
    baseline: site.baseline_facility_kw,
  });
  drawSite();
  drawActiveEvent();
  drawEvents();
  await readFast(); // fast.js: armed depths, frequency feed, fast events
  return activePlanId() !== previousPlan;
}

function activePlanId() {
  const event = state.events.find((e) => e.id === state.site.active_event_id);
  return event ? event.plan_id : null;
}

async function slow() {
  const planId = activePlanId();
  const [jobs, nodes, sync, plan] = await Promise.all([
    api("/v1/jobs"), api("/v1/nodes"), api("/v1/sync"),
    planId ? api(`/v1/plans/${encodeURIComponent(planId)}`) : Promise.resolve(null),
  ]);
  state.jobs = jobs.jobs;
  state.pfi = new Map((jobs.pfi || []).map((p) => [p.id, p]));
  state.nodes = nodes.nodes;
  state.sync = sync;
  state.plan = plan;
  const order = sync.order_parameters;
  if (order) remember(state.order, { t: Date.now() / 1000, r1: order.r1, r2: order.r2, r3: order.r3 });
  drawJobs();
  drawNodes();
  drawSync();
}

async function poll() {
  try {
    const planChanged = await fast();
    if (planChanged || state.round % SLOW_EVERY === 0) await slow();
    if (state.round % QUOTE_EVERY === 0) {
      const body = state.quoteWindowS === null ? {} : { window_s: state.quoteWindowS };
      drawQuote(await api("/v1/quotes", { method: "POST", body }));
    }
    state.round += 1;
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    setText("status", "live");
    setText("updated", new Date().toLocaleTimeString([], { hour12: false }));
    showError("");
  } catch (error) {
    setText("status", "not updating");
    showError(`Reading the gateway failed: ${error.message}`);
  } finally {
    setTimeout(poll, FAST_S * 1000);
  }
}

// ---- actions -----------------------------------------------------------------------------

async function cancelEvent(id) {
  if (!window.confirm(`Cancel event ${id}? Caps are restored (an OpenADR event is opted out).`)) return;
  try {
    const event = await api(`/v1/events/${encodeURIComponent(id)}`, { method: "DELETE" });
    setText("event-form-result", `${event.id} is ${event.status}`);
    showError("");
    state.round = 0; // read everything again now
  } catch (error) {
    showError(`Cancelling ${id} was refused: ${error.message}`);
  }
}

function numberOrText(input) {
  // What the operator typed goes to the API as a number when it is one; the API judges it.
  const text = input.value.trim();
  return text !== "" && Number.isFinite(Number(text)) ? Number(text) : text;
}

async function createEvent(submit) {
  submit.preventDefault();
  const startText = $("event-start").value.trim();
  const body = {
    reduction_kw: numberOrText($("event-reduction-kw")),
    start: startText || new Date().toISOString(),
    duration_s: numberOrText($("event-duration-s")),
  };
  const question = `Create an event: ${body.reduction_kw} kW from ${body.start} for ${body.duration_s} s?`;
  if (!window.confirm(question)) return;
  try {
    const event = await api("/v1/events", { method: "POST", body });
    setText("event-form-result", `created ${event.id} (${event.status})`);
    showError("");
    state.round = 0;
  } catch (error) {
    setText("event-form-result", "");
    showError(`Creating the event was refused: ${error.message}`);
  }
}

async function askQuote(submit) {
  submit.preventDefault();
  const body = {
    reduction_kw: numberOrText($("quote-reduction-kw")),
    window_s: numberOrText($("quote-window-s")),
  };
  try {
    const quote = await api("/v1/quotes", { method: "POST", body });
    state.quoteWindowS = quote.window_s;
    drawQuote(quote);
    const asked = `${body.reduction_kw} kW for ${body.window_s} s`;
    setText("quote-result", quote.requested_feasible
      ? `${asked}: feasible, costs ${num(quote.requested_throughput_loss, 0)} throughput`
      : `${asked}: not feasible (at most ${num(quote.achievable_kw)} kW)`);
    showError("");
  } catch (error) {
    setText("quote-result", "");
    showError(`The quote was refused: ${error.message}`);
  }
}

function useToken(submit) {
  submit.preventDefault();
  state.token = $("token").value.trim();
  if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token);
  else sessionStorage.removeItem(TOKEN_KEY);
  $("token").value = "";
  $("token").placeholder = state.token ? "token set for this tab" : "read or API token";
  state.round = 0;
}

function forgetToken() {
  state.token = "";
  sessionStorage.removeItem(TOKEN_KEY);
  $("token").placeholder = "read or API token";
}

function redrawCharts() {
  if (state.site) {
    drawSite();
    drawEvents();
  }
  if (state.sync) drawSync();
}

function start() {
  $("token-form").addEventListener("submit", useToken);
  $("forget").addEventListener("click", forgetToken);
  $("event-form").addEventListener("submit", createEvent);
  $("quote-form").addEventListener("submit", askQuote);
  $("span").addEventListener("change", redrawCharts);
  document.querySelectorAll("#jobs th").forEach((th) => th.addEventListener("click", () => {
    state.sortUp = state.sortKey === th.dataset.key ? !state.sortUp : true;
    state.sortKey = th.dataset.key;
    drawJobs();
  }));
  if (state.token) $("token").placeholder = "token set for this tab";
  setText("poll-note", `site and events every ${FAST_S} s, jobs, nodes and sync every `
    + `${FAST_S * SLOW_EVERY} s, the supply curve every ${FAST_S * QUOTE_EVERY} s`);
  poll();
}

document.addEventListener("DOMContentLoaded", start);
