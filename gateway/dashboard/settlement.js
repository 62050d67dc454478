// The dashboard's settlement view: an event settled under each of the program's baseline
// rules, read from GET /v1/events/{id}/settlement when the operator asks (computing it reads
// weeks of meter history, so the page never polls it). Uses dashboard.js's helpers (api, num,
// svgNode, lineChart, cell), loaded before this file.
"use strict";

const SETTLE_MARKS = [["estimated", "estimated"], ["fault", "meter fault"], ["gap", "gap"]];
let settling = 0; // the last settlement asked: an older answer arriving later is dropped

// The events the select offers: every one that has begun, newest first.
function fillSettlementChoices(sorted) {
  const select = $("settlement-event");
  const started = sorted.filter((e) => e.status !== "pending");
  const signature = JSON.stringify(started.map((e) => [e.id, e.status]));
  if (select.dataset.signature === signature) return;
  select.dataset.signature = signature;
  const chosen = select.value;
  select.replaceChildren(...started.map((e) => {
    const option = document.createElement("option");
    option.value = e.id;
    const start = new Date(e.start).toLocaleString([], { dateStyle: "short", timeStyle: "short", hour12: false });
    option.textContent = `${e.id} (${start}, ${e.status})`;
    return option;
  }));
  if (started.some((e) => e.id === chosen)) select.value = chosen;
}

function settlementError(message) {
  const box = $("settlement-error");
  box.textContent = message || "";
  box.hidden = !message;
}

async function settle(id) {
  const rules = $("settlement-rules").value.trim();
  const query = rules ? `?rules=${encodeURIComponent(rules)}` : "";
  const view = $("settlement-view");
  const asked = ++settling;
  setText("settlement-note", `settling ${id}…`);
  try {
    const doc = await api(`/v1/events/${encodeURIComponent(id)}/settlement${query}`);
    if (asked !== settling) return;
    settlementError("");
    drawSettlement(doc);
  } catch (error) {
    if (asked !== settling) return;
    // Nothing stale under the error: the figures shown are of no settlement.
    view.replaceChildren();
    setText("settlement-note", "");
    settlementError(`Settling ${id} was refused: ${error.message}`);
  }
}

function showSettlement(id) {
  $("settlement-event").value = id;
  $("settlement").scrollIntoView();
  settle(id);
}

// A clock on the site's time zone, the one the settlement's intervals are cut on.
function siteClock(zone) {
  const format = { timeZone: zone, hour12: false, hour: "2-digit", minute: "2-digit" };
  return (t) => new Date(t * 1000).toLocaleTimeString([], format);
}

function drawSettlement(doc) {
  const hhmm = siteClock(doc.timezone);
  const at = (iso) => hhmm(new Date(iso).getTime() / 1000);
  const day = new Date(doc.start).toLocaleDateString([], { timeZone: doc.timezone });
  setText("settlement-note", `${doc.event_id}, ${doc.status}: ${day} ${at(doc.start)}–${at(doc.end)} `
    + `on the site's clock (${doc.timezone}), ${doc.interval_min}-min intervals; other event `
    + `days left out of the baselines: ${doc.event_days_excluded.join(", ") || "none"}; `
    + `throughput kept ${doc.throughput_kept === null ? "–" : `${num(doc.throughput_kept * 100, 0)} %`}`);
  $("settlement-view").replaceChildren(...doc.rules.map((rule) => ruleView(rule, doc, hhmm)));
}

function ruleView(rule, doc, hhmm) {
  const box = document.createElement("div");
  box.className = "rule";
  box.dataset.rule = rule.rule;
  const title = document.createElement("h3");
  title.textContent = `${rule.rule} (${rule.kind})`;
  box.appendChild(title);
  box.appendChild(ruleFigures(rule, hhmm));
  if (rule.reason) {
    const why = document.createElement("p");
    why.className = "reason bad";
    why.textContent = `No baseline: ${rule.reason}`;
    box.appendChild(why);
  }
  box.appendChild(settlementKey());
  box.appendChild(settlementChart(rule, doc, hhmm));
  box.appendChild(intervalTable(rule, hhmm));
  return box;
}

function figure(list, label, value, className) {
  const item = document.createElement("div");
  const dt = document.createElement("dt");
  const dd = document.createElement("dd");
  dt.textContent = label;
  dd.textContent = value;
  if (className) dd.className = className;
  item.append(dt, dd);
  list.appendChild(item);
}

function ruleFigures(rule, hhmm) {
  const totals = rule.totals;
  const list = document.createElement("dl");
  list.className = "figures small";
  figure(list, "Delivered", `${num(totals.delivered_kwh)} kWh`, "delivered-kwh");
  figure(list, "Target", `${num(totals.target_kwh)} kWh`, "target-kwh");
  const share = totals.compliance === null ? "–" : `${num(totals.compliance * 100, 0)} %`;
  figure(list, "Compliance", `${share} (${totals.intervals_met} of ${totals.intervals} intervals met)`,
    totals.compliance !== null && totals.compliance < 1 ? "compliance short" : "compliance");
  figure(list, "Mean delivered / asked", `${num(totals.mean_delivered_kw)} / ${num(totals.mean_target_kw)} kW`);
  figure(list, "Baseline", baselineText(rule), "baseline");
  const at = (list) => list.map((iso) => hhmm(new Date(iso).getTime() / 1000)).join(", ") || "none";
  figure(list, "Estimated", at(totals.estimated_intervals), "estimated");
  figure(list, "Meter fault", at(totals.fault_intervals), "fault");
  figure(list, "Unsettled", at(totals.unsettled_intervals), "unsettled");
  return list;
}

function baselineText(rule) {
  const base = rule.baseline;
  if (!base) return "none";
  const days = base.days_used.length === 1 ? base.days_used[0] : `${base.days_used.length} days`;
  if (!base.adjusted) return days;
  const moved = rule.parameters.adjustment === "multiplicative"
    ? `×${num(base.adjustment_factor, 3)}` : `${base.adjustment_kw >= 0 ? "+" : ""}${num(base.adjustment_kw)} kW`;
  return `${days}, day-of adjustment ${moved}${base.capped ? " (capped)" : ""}`;
}

function settlementKey() {
  const head = document.createElement("div");
  head.className = "chart-head";
  head.innerHTML = "<span>Per interval [kW]: <i class=\"key meter\"></i>metered "
    + "<i class=\"key baseline\"></i>baseline <i class=\"key target\"></i>target load (baseline less "
    + "target) <i class=\"key unmet\"></i>target not met <i class=\"key estimated\"></i>estimated</span>";
  return head;
}

// Step lines, one level per interval, broken where a value is missing.
function steps(rows, value, cls) {
  return (x, y) => {
    let d = "";
    let lastEnd = null;
    for (const row of rows) {
      const v = value(row);
      if (v === null || v === undefined) { lastEnd = null; continue; }
      const [t0, t1] = [row.t0, row.t1];
      d += `${lastEnd === t0 ? "L" : "M"}${x(t0).toFixed(1)},${y(v).toFixed(1)}L${x(t1).toFixed(1)},${y(v).toFixed(1)}`;
      lastEnd = t1;
    }
    return svgNode("path", { d: d || "M0,0", class: `series ${cls}` });
  };
}

// Shaded intervals (those `keep` picks), between the heights `edges(y)` gives.
function bands(rows, keep, cls, edges) {
  return (x, y) => {
    const [top, bottom] = edges(y);
    const g = svgNode("g", { class: `band ${cls}` });
    for (const row of rows.filter(keep)) {
      g.appendChild(svgNode("rect", { x: x(row.t0), width: x(row.t1) - x(row.t0), y: top, height: bottom - top }));
    }
    return g;
  };
}

function settlementChart(rule, doc, hhmm) {
  const svg = svgNode("svg", { class: "chart settlement-chart", viewBox: "0 0 800 200", role: "img",
    "aria-label": `${rule.rule}: baseline, metered and target per interval` });
  const rows = rule.intervals.map((r) => ({ ...r, t0: new Date(r.start).getTime() / 1000,
    t1: new Date(r.end).getTime() / 1000, load: r.baseline_kw === null ? null : r.baseline_kw - r.target_kw }));
  const values = rows.flatMap((r) => [r.baseline_kw, r.metered_kw, r.load]);
  const t0 = rows.length ? rows[0].t0 : new Date(doc.start).getTime() / 1000;
  const t1 = rows.length ? rows[rows.length - 1].t1 : new Date(doc.end).getTime() / 1000;
  const [lo, hi] = span(values);
  const marks = [
    bands(rows, (r) => !r.met, "unmet", (y) => [y(hi), y(lo)]),
    bands(rows, (r) => r.estimated, "estimated", (y) => [y(lo) - 6, y(lo)]),
    steps(rows, (r) => r.baseline_kw, "baseline"),
    steps(rows, (r) => r.load, "target"),
    steps(rows, (r) => r.metered_kw, "meter"),
  ];
  lineChart(svg, { xDomain: timeDomain(t0, t1), yDomain: [lo, hi], xLabel: hhmm, series: [], marks });
  svg.appendChild(svgNode("text", { x: 14, y: 100, class: "tick middle", transform: "rotate(-90 14 100)" }, "kW"));
  return svg;
}

function intervalTable(rule, hhmm) {
  const table = document.createElement("table");
  table.className = "intervals";
  table.innerHTML = "<thead><tr><th>interval</th><th>baseline kW</th><th>metered kW</th>"
    + "<th>target kW</th><th>delivered kW</th><th>delivered kWh</th><th>met</th><th>marks</th></tr></thead>";
  const body = document.createElement("tbody");
  for (const r of rule.intervals) {
    const row = document.createElement("tr");
    row.dataset.start = r.start;
    row.className = r.met ? "met" : "unmet";
    cell(row, `${hhmm(new Date(r.start).getTime() / 1000)}–${hhmm(new Date(r.end).getTime() / 1000)}`);
    cell(row, num(r.baseline_kw), "baseline");
    cell(row, num(r.metered_kw), "metered");
    cell(row, num(r.target_kw), "target");
    cell(row, num(r.delivered_kw), "delivered");
    cell(row, num(r.delivered_kwh, 2), "kwh");
    cell(row, r.met ? "yes" : shortfall(r), "met");
    cell(row, SETTLE_MARKS.filter(([key]) => r[key]).map(([, label]) => label).join(", "), "marks");
    body.appendChild(row);
  }
  table.appendChild(body);
  return table;
}

// "no", and by how much where both figures are known: 3.0 kW delivered against 3.0 asked
// reads as met unless the page says it fell 0.02 kW short.
function shortfall(row) {
  if (row.delivered_kw === null) return "no";
  const short = row.target_kw - row.delivered_kw;
  return `no (${short >= 0.01 ? num(short, 2) : short.toPrecision(1)} kW short)`;
}

function startSettlement() {
  $("settlement-form").addEventListener("submit", (submit) => {
    submit.preventDefault();
    const id = $("settlement-event").value;
    if (id) settle(id);
    else settlementError("No event to settle: none has begun yet.");
  });
}

document.addEventListener("DOMContentLoaded", startSettlement);
