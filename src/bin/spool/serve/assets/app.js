// The dashboard: polls /api/overview once a second and redraws the tables; keeps each
// group's lag history for its sparkline and each topic's last `next` for its rate.
// Every figure cell carries data-topic, data-group and data-field, so that a test (or a
// user's script) finds it without reading the layout.
"use strict";

const POLL_MS = 1000;
const HISTORY = 60;
const lagHistory = new Map(); // "topic\u0000group" -> [lag, ...]
const lastNext = new Map(); // topic -> {next, at}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = String(text);
  return e;
}

function cell(value, field, topic, group, cls) {
  const attrs = { "data-field": field, "data-topic": topic };
  if (group !== undefined) attrs["data-group"] = group;
  if (cls) attrs["class"] = cls;
  return el("td", attrs, value);
}

function sparkline(values) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 120 24");
  const max = Math.max(1, ...values);
  const step = values.length > 1 ? 120 / (values.length - 1) : 0;
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(23 - (v / max) * 22).toFixed(1)}`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.appendChild(line);
  return svg;
}

function rate(t, now) {
  const last = lastNext.get(t.topic);
  lastNext.set(t.topic, { next: t.next, at: now });
  if (!last || now <= last.at) return "–";
  const perSec = ((t.next - last.next) * 1000) / (now - last.at);
  return `${perSec.toFixed(1)}/s`;
}

function drawTopics(topics, now) {
  const body = document.querySelector("#topics tbody");
  body.replaceChildren();
  for (const t of topics) {
    const tr = el("tr");
    tr.appendChild(cell(t.topic, "topic", t.topic));
    for (const f of ["earliest", "next", "messages", "bytes"]) {
      tr.appendChild(cell(t[f], f, t.topic, undefined, "num"));
    }
    tr.appendChild(cell(rate(t, now), "rate", t.topic, undefined, "num"));
    body.appendChild(tr);
  }
  if (topics.length === 0) body.appendChild(el("tr", {}, "")).appendChild(el("td", { colspan: 6, class: "empty" }, "no topics"));
}

function drawGroups(groups) {
  const body = document.querySelector("#groups tbody");
  body.replaceChildren();
  for (const g of groups) {
    const key = `${g.topic}\u0000${g.group}`;
    const h = lagHistory.get(key) || [];
    h.push(g.lag);
    while (h.length > HISTORY) h.shift();
    lagHistory.set(key, h);
    const tr = el("tr");
    tr.appendChild(cell(g.topic, "topic", g.topic, g.group));
    tr.appendChild(cell(g.group, "group", g.topic, g.group));
    tr.appendChild(cell(g.cursor, "cursor", g.topic, g.group, "num"));
    tr.appendChild(cell(g.next, "next", g.topic, g.group, "num"));
    tr.appendChild(cell(g.lag, "lag", g.topic, g.group, g.lag > 0 ? "num lagging" : "num"));
    const spark = cell("", "lag-history", g.topic, g.group);
    spark.appendChild(sparkline(h));
    tr.appendChild(spark);
    tr.appendChild(cell(g.in_flight, "in_flight", g.topic, g.group, "num"));
    const p = g.pending;
    const pending = p.length === 0 ? "0" : `${p.length} (${p[0].last_reason})`;
    tr.appendChild(cell(pending, "pending", g.topic, g.group));
    tr.appendChild(cell(g.dead_lettered, "dead_lettered", g.topic, g.group, "num"));
    tr.appendChild(cell(g.skipped, "skipped", g.topic, g.group, "num"));
    body.appendChild(tr);
  }
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const r = await fetch("/api/overview", { cache: "no-store" });
    if (!r.ok) throw new Error(`${r.status} ${r.statusText}`);
    const o = await r.json();
    const now = Date.now();
    drawTopics(o.topics, now);
    drawGroups(o.groups);
    status.textContent = `updated ${new Date(now).toLocaleTimeString()}`;
    status.className = "status";
  } catch (e) {
    status.textContent = `cannot reach the server: ${e.message}`;
    status.className = "status error";
  }
  setTimeout(poll, POLL_MS);
}

function hex(bytes) {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
}

function payloadBytes(m) {
  if (m.payload_base64 !== undefined) return Uint8Array.from(atob(m.payload_base64), (c) => c.charCodeAt(0));
  return new TextEncoder().encode(m.payload);
}

async function loadDlqTopics() {
  const select = document.getElementById("dlq-topic");
  const r = await fetch("/api/dlq", { cache: "no-store" });
  if (!r.ok) return;
  const rows = await r.json();
  select.replaceChildren(...rows.map((d) => el("option", { value: d.topic }, `${d.topic} (${d.messages})`)));
  if (rows.length > 0) showDlq();
}

async function showDlq(event) {
  if (event) event.preventDefault();
  const topic = document.getElementById("dlq-topic").value;
  const body = document.querySelector("#dlq tbody");
  if (!topic) return;
  const reason = document.getElementById("dlq-reason").value;
  const asHex = document.getElementById("dlq-hex").checked;
  const q = new URLSearchParams({ max: "100" });
  if (reason) q.set("reason", reason);
  const r = await fetch(`/api/dlq/${encodeURIComponent(topic)}?${q}`, { cache: "no-store" });
  body.replaceChildren();
  if (!r.ok) {
    body.appendChild(el("tr")).appendChild(el("td", { colspan: 7, class: "empty" }, (await r.json()).error));
    return;
  }
  for (const m of await r.json()) {
    const h = m.headers;
    const tr = el("tr", { "data-offset": m.offset });
    tr.appendChild(el("td", { class: "num" }, m.offset));
    tr.appendChild(el("td", {}, `${h["x-original-topic"] || "-"}:${h["x-original-offset"] || "-"}`));
    tr.appendChild(el("td", {}, h["x-consumer-group"] || "-"));
    tr.appendChild(el("td", { class: "num" }, h["x-delivery-attempts"] || "-"));
    tr.appendChild(el("td", { "data-field": "x-dead-letter-reason" }, h["x-dead-letter-reason"] || "-"));
    const headers = Object.entries(h).map(([k, v]) => `${k}: ${v}`).join("\n");
    tr.appendChild(el("td", { class: "headers payload" }, headers));
    const text = asHex || m.payload === undefined ? hex(payloadBytes(m)) : m.payload;
    tr.appendChild(el("td", { class: "payload", "data-field": "payload" }, text));
    body.appendChild(tr);
  }
  if (!body.firstChild) body.appendChild(el("tr")).appendChild(el("td", { colspan: 7, class: "empty" }, "no dead letters match"));
}

// ---- changes (only in a browser that opened the link `spool serve --allow-writes`
// printed: the page then says so in a meta tag, and the session cookie goes along) ----

const writesMeta = document.querySelector('meta[name="spool-writes"]');
// What each form's last dry run sent: Execute sends exactly that, and nothing else.
const dryRuns = { reset: null, replay: null };

async function change(path, body) {
  const r = await fetch(path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const answer = await r.json();
  if (!r.ok) throw new Error(answer.error);
  return answer;
}

function resetRequest() {
  const [topic, group] = document.getElementById("reset-group").value.split("\u0000");
  const kind = document.getElementById("reset-kind").value;
  const raw = document.getElementById("reset-value").value;
  const body = { topic, group, execute: false };
  if (kind === "to_earliest" || kind === "to_latest") body[kind] = true;
  else if (kind === "to_offset" || kind === "shift_by") body[kind] = Number(raw);
  else body[kind] = raw;
  return { path: "/api/reset", body };
}

function replayRequest() {
  const dlq = document.getElementById("dlq-topic").value;
  const body = { to: document.getElementById("replay-to").value, execute: false };
  const reason = document.getElementById("dlq-reason").value;
  if (reason) body.reason = reason;
  return { path: `/api/dlq/${encodeURIComponent(dlq)}/replay`, body };
}

const describe = {
  reset: (a) => `${a[0].topic}/${a[0].group}: ${a[0].old} → ${a[0].new} ${a[0].executed ? "(done)" : "(dry run)"}`,
  replay: (a) => `${a.replayed} copied to ${a.to}, ${a.duplicates} already there ${a.executed ? "(done)" : "(dry run)"}`,
};

async function run(which, request) {
  const out = document.getElementById(`${which}-result`);
  const execute = document.getElementById(`${which}-execute`);
  execute.disabled = true; // at the click: a double click sends one change
  try {
    const answer = await change(request.path, request.body);
    out.textContent = describe[which](answer);
    out.className = "result";
    if (!request.body.execute) {
      dryRuns[which] = request;
      execute.disabled = false;
    } else {
      dryRuns[which] = null;
    }
  } catch (e) {
    out.textContent = e.message;
    out.className = "result error";
  }
}

function dryRun(which, build) {
  return (e) => {
    e.preventDefault();
    run(which, build());
  };
}

function executeLast(which) {
  const dry = dryRuns[which];
  if (dry) run(which, { path: dry.path, body: { ...dry.body, execute: true } });
}

async function setUpWrites() {
  if (!writesMeta) return;
  document.getElementById("writes").hidden = false;
  const r = await fetch("/api/overview", { cache: "no-store" });
  const o = await r.json();
  document.getElementById("reset-group").replaceChildren(
    ...o.groups.map((g) => el("option", { value: `${g.topic}\u0000${g.group}` }, `${g.topic} / ${g.group}`)),
  );
  for (const [which, build] of [["reset", resetRequest], ["replay", replayRequest]]) {
    const form = document.getElementById(`${which}-form`);
    form.addEventListener("submit", dryRun(which, build));
    // Anything changed after the dry run: run it again before Execute.
    form.addEventListener("input", () => { document.getElementById(`${which}-execute`).disabled = true; dryRuns[which] = null; });
    document.getElementById(`${which}-execute`).addEventListener("click", () => executeLast(which));
  }
  // The replay's source and filter are the dead-letter form's.
  document.getElementById("dlq-form").addEventListener("input", () => { document.getElementById("replay-execute").disabled = true; dryRuns.replay = null; });
}

document.getElementById("dlq-form").addEventListener("submit", showDlq);
setUpWrites();
document.getElementById("dlq-hex").addEventListener("change", () => showDlq());
poll();
loadDlqTopics();
