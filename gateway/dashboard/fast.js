// The dashboard's fast path (docs/fast.md): the depths armed on the agents
// (GET /v1/fast/armed), the frequency feed when one is configured (GET /v1/fast/frequency),
// and the fast events (source `fast` in /v1/events) with each trigger's time from sent to
// every agent's caps enforced (GET /v1/fast/triggers). Uses dashboard.js's helpers (api,
// num, clock, ago, cell, setText), loaded before this file; read with the page's other
// figures every few seconds.
"use strict";

const fastState = { armed: null, frequency: null, triggers: [] };

async function readFast() {
  const [armed, frequency, triggers] = await Promise.all([
    api("/v1/fast/armed"), api("/v1/fast/frequency"), api("/v1/fast/triggers"),
  ]);
  fastState.armed = armed;
  fastState.frequency = frequency;
  fastState.triggers = triggers.triggers;
  drawFast();
}

function drawFast() {
  const armed = fastState.armed;
  if (!armed) return;
  $("fast").dataset.enabled = String(armed.enabled);
  setText("fast-state", !armed.enabled ? "off" : armed.holding ? "triggered" : "armed");
  setText("fast-generation", armed.generation ? String(armed.generation) : "–");
  setText("fast-rearm", armed.last_rearm_at ? `${clock(armed.last_rearm_at)} (${ago(armed.last_rearm_at)})` : "never");
  setText("fast-settled", armed.settled ? "yes" : "no");
  setText("fast-nodes-sent", String(armed.nodes_sent));
  $("fast-depths-rows").replaceChildren(...armed.depths_pct.map((depth) => {
    const key = String(depth);
    const row = document.createElement("tr");
    row.dataset.depth = key;
    cell(row, `${depth} %`, "depth");
    cell(row, num(armed.expected_reduction_kw[key]), "kw");
    cell(row, String(armed.armed_nodes[key] ?? 0), "nodes");
    return row;
  }));
  drawFrequency(fastState.frequency);
  drawFastEvents();
}

function drawFrequency(feed) {
  const box = $("fast-frequency");
  box.hidden = !feed || !feed.enabled;
  if (box.hidden) return;
  setText("freq-hz", feed.hz === null ? "–" : feed.hz.toFixed(3));
  setText("freq-source", `${feed.source} (${feed.mode}, every ${feed.period_s} s)`);
  setText("freq-fault", feed.fault || "none");
  setText("freq-depth", feed.depth_pct ? `${feed.depth_pct} %` : "none");
  setText("freq-crossing", feed.crossing_at ? clock(feed.crossing_at) : "–");
  setText("freq-triggers", String(feed.triggers));
  setText("freq-delay", `${num(feed.delay_s, 3)} s configured, `
    + `${feed.measured_trigger_delay_s === null ? "none" : num(feed.measured_trigger_delay_s, 3) + " s"} measured`);
}

// Each fast event: its depths in order, its triggers (the first and its renewals), and the
// time from its first trigger to the last agent's report of caps enforced.
function drawFastEvents() {
  const fast = state.events.filter((e) => e.source === "fast")
    .sort((a, b) => b.start.localeCompare(a.start));
  const bySeq = new Map(fastState.triggers.map((t) => [t.seq, t]));
  $("fast-events-rows").replaceChildren(...fast.map((event) => {
    const row = document.createElement("tr");
    row.dataset.eventId = event.id;
    const stretches = event.intervals || [];
    const triggers = stretches.flatMap((s) => s.triggers || []);
    const first = triggers.length ? bySeq.get(triggers[0].seq) : undefined;
    cell(row, event.id, "id");
    cell(row, event.status, "status");
    cell(row, clock(event.start));
    cell(row, clock(event.end));
    cell(row, stretches.map((s) => `${s.depth_pct} %`).join(" → "), "depths");
    cell(row, String(Math.max(triggers.length - 1, 0)), "renewals");
    const latency = cell(row, first && first.enforced_s !== null ? num(first.enforced_s * 1000, 0) : "–", "latency");
    latency.title = first ? `${first.reports} reports, ${first.nodes_applied} nodes at their armed caps` : "no report kept since the gateway started";
    cell(row, event.external_id || "", "external");
    return row;
  }));
}
