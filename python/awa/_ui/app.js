// The Awa web UI: one page, hash routes (#/jobs?state=failed), plain DOM, no build step.
// Every number comes from the JSON API under /api; mutations are POST/DELETE with a JSON
// body. In read-only mode (GET /api/capabilities) no action button is rendered.
"use strict";

// Auto-refresh period: 5 s, or ?refresh=SECONDS in the page URL (0 turns it off).
const REFRESH_PARAM = new URLSearchParams(location.search).get("refresh");
const REFRESH_MS = REFRESH_PARAM === null || isNaN(Number(REFRESH_PARAM)) ? 5000 : Number(REFRESH_PARAM) * 1000;
const STATES = ["scheduled", "available", "running", "waiting_external", "retryable", "completed", "failed", "cancelled"];
const app = document.getElementById("app");
let caps = { read_only: true, auth: false };
let timer = null;
let selected = new Set(); // job ids ticked on the jobs page (kept across refreshes)

// ----- helpers -----------------------------------------------------------------------------

function esc(value) {
  return String(value === null || value === undefined ? "" : value)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

function fmtTime(text) {
  if (!text) return "";
  const d = new Date(text);
  return isNaN(d) ? text : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function fmtLag(seconds) {
  if (seconds < 60) return seconds.toFixed(1) + "s";
  if (seconds < 3600) return (seconds / 60).toFixed(1) + "m";
  return (seconds / 3600).toFixed(1) + "h";
}

function qs(params) {
  const parts = [];
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(v));
  }
  return parts.length ? "?" + parts.join("&") : "";
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  return { path, params: Object.fromEntries(new URLSearchParams(query || "")) };
}

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(method, path, body) {
  const headers = {};
  const token = sessionStorage.getItem("awa-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const init = { method, headers };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body || {});
  }
  const resp = await fetch(path, init);
  const data = (resp.headers.get("Content-Type") || "").startsWith("application/json") ? await resp.json() : await resp.text();
  if (!resp.ok) throw new ApiError(resp.status, (data && data.error) || resp.statusText);
  return data;
}

function button(action, label, attrs, danger) {
  if (caps.read_only) return "";
  const extra = Object.entries(attrs || {}).map(([k, v]) => ` data-${k}="${esc(v)}"`).join("");
  return `<button type="button" class="btn${danger ? " danger" : ""}" data-action="${action}"${extra}>${esc(label)}</button>`;
}

function stateBadge(state) {
  return `<span class="state state-${esc(state)}">${esc(state)}</span>`;
}

function jobLink(id) {
  return `<a href="#/jobs/${esc(id)}">${esc(id)}</a>`;
}

function flash(message, kind) {
  const el = document.getElementById("flash");
  if (!el) return;
  el.textContent = message;
  el.className = "flash " + (kind || "ok");
}

// ----- the chart (inline SVG, no library) --------------------------------------------------

function chart(points) {
  const w = 720, h = 160, pad = 24;
  const series = [["completed", "c-completed"], ["failed", "c-failed"], ["cancelled", "c-cancelled"]];
  const max = Math.max(1, ...points.map(p => Math.max(p.completed, p.failed, p.cancelled)));
  const x = i => pad + (points.length <= 1 ? 0 : (i * (w - 2 * pad)) / (points.length - 1));
  const y = v => h - pad - (v * (h - 2 * pad)) / max;
  const lines = series.map(([key, cls]) => {
    const d = points.map((p, i) => `${i ? "L" : "M"}${x(i).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ");
    return `<path class="line ${cls}" d="${d}"></path>`;
  }).join("");
  const total = key => points.reduce((n, p) => n + p[key], 0);
  return `<svg id="throughput" class="chart" viewBox="0 0 ${w} ${h}" role="img" aria-label="jobs finalized per minute">
      <line class="axis" x1="${pad}" y1="${h - pad}" x2="${w - pad}" y2="${h - pad}"></line>
      <text class="tick" x="${pad}" y="${pad - 8}">${max}/min</text>${lines}</svg>
    <div class="legend">${series.map(([k, cls]) => `<span class="key ${cls}">${k}: ${total(k)}</span>`).join(" ")}</div>`;
}

// ----- pages -------------------------------------------------------------------------------

async function pageDashboard() {
  const [stats, series, queues, failures] = await Promise.all([
    api("GET", "/api/stats"), api("GET", "/api/stats/timeseries?minutes=60"),
    api("GET", "/api/queues"), api("GET", "/api/jobs?state=failed&limit=10"),
  ]);
  const cards = STATES.map(s => {
    const approx = stats.estimated.includes(s) ? "~" : "";
    return `<a class="card" href="#/jobs?state=${s}" data-state="${s}"><div class="n">${approx}${stats.counts[s]}</div>${stateBadge(s)}</a>`;
  }).join("");
  return `<h1>Dashboard</h1>
    <div class="cards" id="state-counts">${cards}</div>
    <p class="muted">Last hour: ${stats.last_hour.completed} completed, ${stats.last_hour.failed} failed,
      ${stats.last_hour.cancelled} cancelled. DLQ: <a href="#/dlq">${stats.dlq_depth}</a>.</p>
    <h2>Throughput, last hour</h2>${chart(series.points)}
    <h2>Queues</h2>${queueTable(queues, false)}
    <h2>Recent failures</h2>${jobTable(failures.jobs, false)}`;
}

function jobTable(jobs, selectable) {
  if (!jobs.length) return `<p class="empty">No jobs.</p>`;
  const rows = jobs.map(j => `<tr data-id="${j.id}">
      ${selectable && !caps.read_only ? `<td><input type="checkbox" class="pick" data-id="${j.id}"${selected.has(j.id) ? " checked" : ""}></td>` : ""}
      <td>${jobLink(j.id)}</td><td>${esc(j.kind)}</td><td>${esc(j.queue)}</td><td>${stateBadge(j.state)}</td>
      <td>${j.attempt}/${j.max_attempts}</td><td>${esc(fmtTime(j.run_at))}</td>
      <td class="err">${esc(lastError(j))}</td></tr>`).join("");
  const pick = selectable && !caps.read_only ? "<th></th>" : "";
  return `<table class="jobs"><thead><tr>${pick}<th>ID</th><th>Kind</th><th>Queue</th><th>State</th><th>Attempt</th>
    <th>Run at</th><th>Last error</th></tr></thead><tbody>${rows}</tbody></table>`;
}

function lastError(job) {
  const errors = job.errors || [];
  return errors.length ? errors[errors.length - 1].error : "";
}

async function pageJobs(params) {
  const page = await api("GET", "/api/jobs" + qs({ ...params, limit: params.limit || 50 }));
  const opt = (value, current) => `<option value="${esc(value)}"${value === (current || "") ? " selected" : ""}>${esc(value || "any")}</option>`;
  const next = page.next_before_id ? `<a id="next-page" href="#/jobs${qs({ ...params, before_id: page.next_before_id })}">Older &rarr;</a>` : "";
  const first = params.before_id ? `<a id="first-page" href="#/jobs${qs({ ...params, before_id: "" })}">&larr; Newest</a>` : "";
  const bulk = caps.read_only ? "" : `<div class="bulk">${button("bulk-retry", "Retry selected")}${button("bulk-cancel", "Cancel selected", {}, true)}</div>`;
  return `<h1>Jobs</h1>
    <form id="job-filters" class="filters">
      <label>State <select name="state">${["", ...STATES].map(s => opt(s, params.state)).join("")}</select></label>
      <label>Kind <input name="kind" value="${esc(params.kind)}"></label>
      <label>Queue <input name="queue" value="${esc(params.queue)}"></label>
      <label>Tag <input name="tag" value="${esc(params.tag)}"></label>
      <button type="submit" class="btn">Filter</button>
    </form>${bulk}${jobTable(page.jobs, true)}<div class="pager">${first} ${next}</div>`;
}

async function pageJob(id) {
  const job = await api("GET", "/api/jobs/" + encodeURIComponent(id));
  const rows = [["Kind", esc(job.kind)], ["Queue", esc(job.queue)], ["State", stateBadge(job.state)],
    ["Priority", job.priority], ["Attempt", `${job.attempt} of ${job.max_attempts}`], ["Run at", fmtTime(job.run_at)],
    ["Created", fmtTime(job.created_at)], ["Attempted", fmtTime(job.attempted_at)], ["Finalized", fmtTime(job.finalized_at)],
    ["Heartbeat", fmtTime(job.heartbeat_at)], ["Deadline", fmtTime(job.deadline_at)], ["Tags", esc((job.tags || []).join(", "))],
    ["Ordering key", esc(job.ordering_key)], ["Callback", esc(job.callback_id)]]
    .map(([k, v]) => `<tr><th>${k}</th><td>${v}</td></tr>`).join("");
  const progress = job.progress ? `<h2>Progress</h2><pre id="job-progress">${esc(JSON.stringify(job.progress, null, 2))}</pre>` : "";
  const attempts = job.attempts.length ? job.attempts.map(a => `<li class="attempt ${a.error ? "failed" : ""}">
      <strong>Attempt ${a.attempt}</strong> <span class="muted">${esc(fmtTime(a.at))}</span> ${a.error ? "" : stateBadge(a.outcome)}
      ${a.error ? `<div class="err">${esc(a.error)}</div>` : ""}
      ${a.traceback ? `<details><summary>Traceback</summary><pre class="traceback">${esc(a.traceback)}</pre></details>` : ""}</li>`).join("")
    : `<li class="muted">Not run yet.</li>`;
  const actions = ["failed", "cancelled", "retryable", "scheduled"].includes(job.state) ? button("retry", "Retry now", { id: job.id }) : "";
  const cancel = ["scheduled", "available", "retryable", "waiting_external", "running"].includes(job.state) ? button("cancel", "Cancel", { id: job.id }, true) : "";
  return `<h1>Job ${esc(job.id)} ${stateBadge(job.state)}</h1>
    <div class="actions">${actions}${cancel}</div>
    <table class="detail">${rows}</table>
    <h2>Args</h2><pre id="job-args">${esc(JSON.stringify(job.args, null, 2))}</pre>
    <h2>Metadata</h2><pre id="job-metadata">${esc(JSON.stringify(job.metadata, null, 2))}</pre>${progress}
    <h2>Attempts</h2><ol class="timeline" id="attempts">${attempts}</ol>`;
}

// A descriptor's docs link, only for http(s) URLs (docs_url is free text: never a javascript: link).
function docsLink(url) {
  return /^https?:\/\//i.test(url || "") ? `<a class="docs" href="${esc(url)}" rel="noopener noreferrer" target="_blank">docs</a>` : "";
}

// What a queue's or kind's descriptor says (queue_descriptor / job_kind_descriptor), if anything.
function describe(d) {
  const parts = [
    d.display_name ? `<strong class="display-name">${esc(d.display_name)}</strong>` : "",
    d.description ? `<span class="description">${esc(d.description)}</span>` : "",
    d.owner ? `<span class="owner">owner: ${esc(d.owner)}</span>` : "",
    docsLink(d.docs_url),
    (d.tags || []).map(t => `<span class="tag">${esc(t)}</span>`).join(" "),
    d.descriptor_stale ? `<span class="flag" title="no live client refreshes this descriptor">stale</span>` : "",
    d.descriptor_mismatch ? `<span class="flag" title="live clients declare different descriptors">mismatch</span>` : "",
  ].filter(Boolean);
  return parts.length ? `<div class="descriptor">${parts.join(" ")}</div>` : "";
}

function queueTable(queues, actions) {
  if (!queues.length) return `<p class="empty">No queues.</p>`;
  const cols = ["available", "running", "scheduled", "retryable", "waiting_external", "failed", "completed", "cancelled"];
  const rows = queues.map(q => `<tr data-queue="${esc(q.queue)}"><td><a href="#/jobs?queue=${encodeURIComponent(q.queue)}">${esc(q.queue)}</a>
      ${q.paused ? '<span class="state state-paused">paused</span>' : ""}${describe(q)}</td>
      ${cols.map(c => `<td class="num">${q.counts[c]}</td>`).join("")}<td class="num">${fmtLag(q.lag_seconds)}</td><td class="num">${q.dlq_depth}</td>
      ${actions ? `<td>${q.paused ? button("resume", "Resume", { queue: q.queue }) : button("pause", "Pause", { queue: q.queue })}
        ${button("drain", "Drain", { queue: q.queue }, true)}</td>` : ""}</tr>`).join("");
  return `<table class="queues"><thead><tr><th>Queue</th>${cols.map(c => `<th>${c.replace("_", " ")}</th>`).join("")}
    <th>Lag</th><th>DLQ</th>${actions ? "<th></th>" : ""}</tr></thead><tbody>${rows}</tbody></table>`;
}

async function pageQueues() {
  return `<h1>Queues</h1>${queueTable(await api("GET", "/api/queues"), true)}`;
}

async function pageKinds() {
  const kinds = await api("GET", "/api/kinds");
  if (!kinds.length) return `<h1>Kinds</h1><p class="empty">No kinds.</p>`;
  const rows = kinds.map(k => `<tr data-kind="${esc(k.kind)}"><td><a href="#/jobs?kind=${encodeURIComponent(k.kind)}">${esc(k.kind)}</a>${describe(k)}</td></tr>`).join("");
  return `<h1>Kinds</h1><table class="kinds"><thead><tr><th>Kind</th></tr></thead><tbody>${rows}</tbody></table>`;
}

async function pageCron() {
  const rows = await api("GET", "/api/cron");
  if (!rows.length) return `<h1>Cron</h1><p class="empty">No schedules.</p>`;
  const body = rows.map(r => `<tr data-name="${esc(r.name)}"><td>${esc(r.name)}</td><td><code>${esc(r.cron_expr)}</code></td>
      <td>${esc(r.timezone)}</td><td>${esc(r.kind)}</td><td>${esc(r.queue)}</td><td>${r.paused ? "paused" : "active"}</td>
      <td>${esc(fmtTime(r.last_enqueued_at))}</td><td>${esc(fmtTime(r.next_fire_at))}</td>
      <td>${button("trigger", "Run now", { name: r.name })}${r.paused ? button("cron-resume", "Resume", { name: r.name }) : button("cron-pause", "Pause", { name: r.name })}</td></tr>`).join("");
  return `<h1>Cron</h1><table class="cron"><thead><tr><th>Name</th><th>Schedule</th><th>Zone</th><th>Kind</th><th>Queue</th>
    <th>Status</th><th>Last enqueued</th><th>Next fire</th><th></th></tr></thead><tbody>${body}</tbody></table>`;
}

async function pageDlq(params) {
  const [page, depth] = await Promise.all([api("GET", "/api/dlq" + qs({ ...params, limit: 50 })), api("GET", "/api/dlq/depth")]);
  const rows = page.jobs.map(r => `<tr data-id="${r.id}"><td>${esc(r.id)}</td><td>${esc(r.kind)}</td><td>${esc(r.queue)}</td>
      <td>${r.attempt}</td><td class="err">${esc(r.reason)}</td><td>${esc(fmtTime(r.dlq_at))}</td>
      <td>${button("dlq-retry", "Retry", { id: r.id })}${button("dlq-delete", "Delete", { id: r.id }, true)}</td></tr>`).join("");
  const table = page.jobs.length ? `<table class="dlq"><thead><tr><th>ID</th><th>Kind</th><th>Queue</th><th>Attempts</th><th>Reason</th>
      <th>Moved</th><th></th></tr></thead><tbody>${rows}</tbody></table>` : `<p class="empty">The DLQ is empty.</p>`;
  const next = page.next_before_id ? `<a id="next-page" href="#/dlq${qs({ ...params, before_id: page.next_before_id })}">Older &rarr;</a>` : "";
  const filter = { kind: params.kind, queue: params.queue, tag: params.tag };
  const bulk = caps.read_only ? "" : `<div class="bulk">${button("dlq-bulk-retry", "Retry all shown by the filter", filter)}
      ${button("dlq-bulk-purge", "Purge all shown by the filter", filter, true)}</div>`;
  return `<h1>Dead-letter queue <span class="muted" id="dlq-total">${depth.total}</span></h1>
    <form id="dlq-filters" class="filters"><label>Kind <input name="kind" value="${esc(params.kind)}"></label>
      <label>Queue <input name="queue" value="${esc(params.queue)}"></label><label>Tag <input name="tag" value="${esc(params.tag)}"></label>
      <button type="submit" class="btn">Filter</button></form>${bulk}${table}<div class="pager">${next}</div>`;
}

async function pageRuntime() {
  const rt = await api("GET", "/api/runtime");
  const leader = rt.leader ? `<table class="detail" id="leader"><tr><th>Backend pid</th><td>${esc(rt.leader.pid)}</td></tr>
      <tr><th>Application</th><td>${esc(rt.leader.application_name)}</td></tr><tr><th>Client</th><td>${esc(rt.leader.client_addr)}</td></tr>
      <tr><th>Connected since</th><td>${esc(fmtTime(rt.leader.backend_start))}</td></tr></table>`
    : `<p class="empty" id="leader">No maintenance leader (no worker is running).</p>`;
  let instances = `<p class="empty">No instances recorded.</p>`;
  if (rt.instances.length) {
    const keys = Object.keys(rt.instances[0]);
    instances = `<table class="instances"><thead><tr>${keys.map(k => `<th>${esc(k)}</th>`).join("")}</tr></thead><tbody>
      ${rt.instances.map(i => `<tr>${keys.map(k => `<td>${esc(typeof i[k] === "object" ? JSON.stringify(i[k]) : i[k])}</td>`).join("")}</tr>`).join("")}</tbody></table>`;
  }
  return `<h1>Runtime</h1><h2>Leader</h2>${leader}<h2>Instances</h2>${instances}
    <p class="muted">Schema version ${rt.schema_version} (this library: ${rt.library_schema_version}).</p>`;
}

// ----- actions -----------------------------------------------------------------------------

const ACTIONS = {
  "retry": { run: d => api("POST", `/api/jobs/${d.id}/retry`), done: d => `Job ${d.id} retried.` },
  "cancel": { confirm: d => `Cancel job ${d.id}?`, run: d => api("POST", `/api/jobs/${d.id}/cancel`), done: d => `Job ${d.id} cancelled.` },
  "bulk-retry": { confirm: () => `Retry ${selected.size} selected jobs?`, run: () => bulk("bulk-retry"), done: (d, r) => bulkMessage("Retried", r) },
  "bulk-cancel": { confirm: () => `Cancel ${selected.size} selected jobs?`, run: () => bulk("bulk-cancel"), done: (d, r) => bulkMessage("Cancelled", r) },
  "pause": { run: d => api("POST", `/api/queues/${encodeURIComponent(d.queue)}/pause`), done: d => `Queue ${d.queue} paused.` },
  "resume": { run: d => api("POST", `/api/queues/${encodeURIComponent(d.queue)}/resume`), done: d => `Queue ${d.queue} resumed.` },
  "drain": { confirm: d => `Cancel every pending job of queue ${d.queue}?`, run: d => api("POST", `/api/queues/${encodeURIComponent(d.queue)}/drain`), done: (d, r) => `Drained ${d.queue}: ${r.cancelled} jobs cancelled.` },
  "trigger": { run: d => api("POST", `/api/cron/${encodeURIComponent(d.name)}/trigger`), done: (d, r) => `Enqueued job ${r.id}.` },
  "cron-pause": { run: d => api("POST", `/api/cron/${encodeURIComponent(d.name)}/pause`), done: d => `Schedule ${d.name} paused.` },
  "cron-resume": { run: d => api("POST", `/api/cron/${encodeURIComponent(d.name)}/resume`), done: d => `Schedule ${d.name} resumed.` },
  "dlq-retry": { run: d => api("POST", `/api/dlq/${d.id}/retry`), done: d => `DLQ job ${d.id} retried.` },
  "dlq-delete": { confirm: d => `Delete DLQ job ${d.id} for good?`, run: d => api("DELETE", `/api/dlq/${d.id}`), done: d => `DLQ job ${d.id} deleted.` },
  "dlq-bulk-retry": { confirm: d => `Retry every DLQ job${filterText(d)}?`, run: d => api("POST", "/api/dlq/bulk-retry", dlqFilter(d)), done: (d, r) => `Retried ${r.retried} DLQ jobs.` },
  "dlq-bulk-purge": { confirm: d => `Delete every DLQ job${filterText(d)} for good?`, run: d => api("POST", "/api/dlq/bulk-purge", dlqFilter(d)), done: (d, r) => `Purged ${r.purged} DLQ jobs.` },
};

function dlqFilter(d) {
  const f = {};
  for (const k of ["kind", "queue", "tag"]) if (d[k]) f[k] = d[k];
  if (!Object.keys(f).length) f.all = true;
  return f;
}

function filterText(d) {
  const f = ["kind", "queue", "tag"].filter(k => d[k]).map(k => `${k} ${d[k]}`);
  return f.length ? " with " + f.join(", ") : "";
}

async function bulk(which) {
  if (!selected.size) throw new ApiError(400, "select some jobs first");
  const r = await api("POST", "/api/jobs/" + which, { ids: [...selected] });
  selected = new Set();
  return r;
}

function bulkMessage(verb, r) {
  const failed = Object.keys(r.errors).length;
  return `${verb} ${r.done.length} jobs` + (failed ? `; ${failed} refused (${Object.values(r.errors)[0]})` : ".");
}

app.addEventListener("click", async event => {
  const el = event.target.closest("[data-action]");
  if (!el) return;
  const action = ACTIONS[el.dataset.action];
  const data = { ...el.dataset };
  if (action.confirm && !window.confirm(action.confirm(data))) return;
  try {
    const result = await action.run(data);
    await render();
    flash(action.done(data, result) || "Done.");
  } catch (err) {
    flash(err.message, "error");
  }
});

app.addEventListener("change", event => {
  if (event.target.classList.contains("pick")) {
    const id = Number(event.target.dataset.id);
    if (event.target.checked) selected.add(id); else selected.delete(id);
  }
});

app.addEventListener("submit", event => {
  const form = event.target;
  event.preventDefault();
  if (form.id === "token-form") {
    sessionStorage.setItem("awa-token", form.elements.token.value);
    start();
    return;
  }
  const params = Object.fromEntries(new FormData(form).entries());
  location.hash = (form.id === "dlq-filters" ? "#/dlq" : "#/jobs") + qs(params);
});

// ----- the shell ---------------------------------------------------------------------------

const NAV = [["#/", "Dashboard"], ["#/jobs", "Jobs"], ["#/queues", "Queues"], ["#/kinds", "Kinds"], ["#/cron", "Cron"], ["#/dlq", "DLQ"], ["#/runtime", "Runtime"]];

function shell(content) {
  const current = "#" + route().path;
  const nav = NAV.map(([href, label]) => {
    const on = href === "#/" ? current === "#/" : current.startsWith(href);
    return `<a href="${href}"${on ? ' class="on"' : ""}>${label}</a>`;
  }).join("");
  const mode = caps.read_only ? `<span class="badge" id="read-only">read-only</span>` : "";
  return `<header><span class="logo">awa</span><nav>${nav}</nav>${mode}</header>
    <main><div id="flash" class="flash"></div>${content}</main>`;
}

let rendering = false;

async function render() {
  if (rendering) return;
  rendering = true;
  const { path, params } = route();
  const keepFlash = document.getElementById("flash");
  const flashState = keepFlash ? [keepFlash.textContent, keepFlash.className] : null;
  try {
    let content;
    const job = path.match(/^\/jobs\/(\d+)$/);
    if (path === "/") content = await pageDashboard();
    else if (path === "/jobs") content = await pageJobs(params);
    else if (job) content = await pageJob(job[1]);
    else if (path === "/queues") content = await pageQueues();
    else if (path === "/kinds") content = await pageKinds();
    else if (path === "/cron") content = await pageCron();
    else if (path === "/dlq") content = await pageDlq(params);
    else if (path === "/runtime") content = await pageRuntime();
    else content = `<h1>Not found</h1><p><a href="#/">Dashboard</a></p>`;
    const html = shell(content);
    const shown = location.hash.replace(/^#/, "") || "/";
    if (html !== app.dataset.html || app.dataset.loaded !== shown) { // unchanged data: keep the DOM
      app.innerHTML = html;
      app.dataset.html = html;
      if (flashState && flashState[0]) flash(flashState[0], flashState[1].replace("flash ", ""));
    }
    app.dataset.loaded = shown; // what tests wait for: the route now on screen
  } catch (err) {
    if (err.status === 401) { askToken(); return; }
    app.innerHTML = shell(`<p class="flash error" id="page-error">${esc(err.message)}</p>`);
  } finally {
    rendering = false;
  }
}

function askToken() {
  clearInterval(timer);
  app.innerHTML = `<main class="login"><h1>awa</h1><form id="token-form"><label>Access token
    <input type="password" name="token" autocomplete="off"></label><button type="submit" class="btn">Open</button></form></main>`;
}

async function start() {
  try {
    caps = await api("GET", "/api/capabilities");
  } catch (err) {
    if (err.status === 401) { askToken(); return; }
    app.innerHTML = `<p class="flash error" id="page-error">${esc(err.message)}</p>`;
    return;
  }
  await render();
  clearInterval(timer);
  if (REFRESH_MS > 0) timer = setInterval(refresh, REFRESH_MS);
}

function refresh() {
  // not while the tab is hidden or someone is typing in a filter
  const typing = document.activeElement && app.contains(document.activeElement) && /^(INPUT|SELECT)$/.test(document.activeElement.tagName);
  if (!document.hidden && !typing) render();
}

window.addEventListener("hashchange", () => { selected = new Set(); flash(""); render(); });
start();
