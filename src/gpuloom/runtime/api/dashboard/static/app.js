// gpuloom dashboard: a client of the service's JSON API (see gpuloom/runtime/api/dashboard/__init__.py).
"use strict";

const KEY = "gpuloom.token";
const REFRESH_MS = Number(new URLSearchParams(location.search).get("refresh") || 2000);
const ACTIVE = ["waiting_for_initial_contact", "waiting_for_initial_resource", "standby", "launching",
  "running_protected", "running", "checkpointing", "stopping"];
const ENDED = ["finished", "failed", "cancelled"];
let me = null;
let timer = null;
// renders are numbered: one overtaken while it awaits its answers (the user opened another page, changed a
// filter, logged out) draws nothing and schedules no refresh, so a page left never replaces the one shown
let renders = 0;
let jobMsg = { id: null, text: "", error: false };  // the answer to the last cancel, kept across refreshes
// the queue is shown a page at a time (QUEUE_PAGE jobs, by id): starts[i] is the id page i comes after
// (null: the first); kept across refreshes, and back to the first page when the one shown empties
const QUEUE_PAGE = Number(new URLSearchParams(location.search).get("page") || 500);
const QUEUE_FIELDS = "id,array,array_id,name,user,queue,st,state,held_s,gpus,progress,nodes,pending_reason,reason";
let queuePage = { starts: [null], index: 0 };
// the charts' time range, and the job list's filters and expanded arrays: kept across refreshes
const RANGES = { "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800 };
let range = "1h";
let filters = { user: "", state: "", queue: "", search: "" };
const expanded = new Set();

// -- DOM helpers: every text goes through textContent (no HTML injection) --------------------
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}
const SVG = "http://www.w3.org/2000/svg";
function sv(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// -- API ---------------------------------------------------------------------------------------
class HttpError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}
// {body, next, total}: the answer, the id a paged listing's next page comes after (X-Next-After),
// and how many the listing holds in all (X-Total-Count)
async function apiCall(path, opts = {}) {
  const token = sessionStorage.getItem(KEY);
  const r = await fetch(path, { ...opts, headers: { ...(opts.headers || {}), Authorization: `Bearer ${token}` } });
  if (r.status === 401) { showLogin("Your token was not accepted."); throw new HttpError(401, "unauthorised"); }
  const ct = r.headers.get("content-type") || "";
  const body = ct.includes("json") ? await r.json() : await r.text();
  if (!r.ok) {
    let msg = body && body.detail !== undefined ? body.detail : body;
    if (Array.isArray(msg)) msg = msg.map(d => d.msg).join("; ");
    throw new HttpError(r.status, `${r.status}: ${msg}`);
  }
  const total = r.headers.get("X-Total-Count");
  return { body, next: r.headers.get("X-Next-After"), total: total === null ? null : Number(total) };
}
async function api(path, opts = {}) { return (await apiCall(path, opts)).body; }
// every page of a paged listing (/history), in order
async function apiPages(path) {
  const sep = path.includes("?") ? "&" : "?";
  let { body: all, next } = await apiCall(path);
  while (next) {
    const page = await apiCall(`${path}${sep}after=${encodeURIComponent(next)}`);
    all = all.concat(page.body);
    next = page.next;
  }
  return all;
}

// -- formatting ----------------------------------------------------------------------------------
function dur(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60), x = s % 60;
  const p = n => String(n).padStart(2, "0");
  return d ? `${d}-${p(h)}:${p(m)}:${p(x)}` : h ? `${h}:${p(m)}:${p(x)}` : `${m}:${p(x)}`;
}
function when(iso) { return iso ? new Date(iso).toLocaleString() : "-"; }
// GPU memory, which NVML gives in MiB
function gib(mib) { return mib === null || mib === undefined ? "-" : `${(mib / 1024).toFixed(1)} GiB`; }
function mem(mb) {
  if (mb === null || mb === undefined) return "-";
  const f = (v, u) => (Math.abs(v - Math.round(v)) < 0.005 ? v.toFixed(0) : v.toFixed(2)) + u;
  return mb >= 1e6 ? f(mb / 1e6, "T") : mb >= 1e3 ? f(mb / 1e3, "G") : f(mb, "M");
}
function reasonOf(j) {
  if (j.st === "PD") return j.pending_reason || j.reason || "";
  if (j.st === "R" || j.st === "CG") return (j.nodes || []).join(",");
  return j.reason || "";
}
// the job page's reason: why it waits (pending) or why it ended; running jobs have none
function jobReason(j) {
  if (j.st === "PD") return j.pending_reason || j.reason || "-";
  if (ENDED.includes(j.state)) return j.reason || "-";
  return "-";
}
// an event's detail as "key: value" pairs (lists joined, nested objects as their own pairs)
function detailText(d) {
  const val = v => Array.isArray(v) ? v.map(x => typeof x === "object" && x !== null ? detailText(x) : x).join(", ")
    : typeof v === "object" && v !== null ? `{${detailText(v)}}` : String(v);
  return Object.entries(d || {}).map(([k, v]) => `${k}: ${val(v)}`).join("; ");
}
function seriesUrl() {
  // about 300 points; from 24 h on, over the stored 5-minute means (a cheap read)
  const step = RANGES[range] >= 86400 ? Math.max(300, Math.round(RANGES[range] / 300)) : Math.max(2, Math.round(RANGES[range] / 300));
  return `/stats/series?since=${range}&step=${step}`;
}
function rangeBar() {
  return el("div", { class: "ranges", id: "ranges" }, "Range: ", Object.keys(RANGES).map(r => el("button",
    { class: r === range ? "on" : null, "data-range": r, onclick: () => { range = r; render(); } }, r)));
}
function jobLink(id, text) { return el("a", { href: `#/job/${id}` }, text === undefined ? id : text); }

// -- charts ----------------------------------------------------------------------------------------
// series: [{name, color, points: [[x, y], ...]}]; x in seconds (absolute); draws axes and a legend
function lineChart(title, series, opts = {}) {
  const W = opts.width || 440, H = opts.height || 170, L = 38, R = 10, T = 22, B = 22;
  const svg = sv("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-chart": opts.id || title });
  svg.append(sv("text", { x: L, y: 14, style: "font-size:12px;fill:#1d2430" }, title));
  const xs = series.flatMap(s => s.points.map(p => p[0])), ys = series.flatMap(s => s.points.map(p => p[1]));
  if (!xs.length) { svg.append(sv("text", { x: L, y: H / 2 }, "no data yet")); return svg; }
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const y1 = opts.yMax !== undefined ? opts.yMax : Math.max(1, ...ys);
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R), Y = y => H - B - y / y1 * (H - T - B);
  svg.append(sv("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#c5ccd6" }));
  svg.append(sv("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#c5ccd6" }));
  svg.append(sv("text", { x: 4, y: T + 4 }, String(Math.round(y1 * 100) / 100)));
  svg.append(sv("text", { x: 4, y: H - B }, "0"));
  svg.append(sv("text", { x: L, y: H - 6 }, opts.xLabel ? opts.xLabel(x0) : ""));
  svg.append(sv("text", { x: W - R - 60, y: H - 6 }, opts.xLabel ? opts.xLabel(x1) : ""));
  let lx = L + 7 * title.length + 12;
  for (const s of series) {
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    svg.append(sv("path", { d, fill: "none", stroke: s.color, "stroke-width": 2 }));
    svg.append(sv("rect", { x: lx, y: 6, width: 10, height: 10, fill: s.color }));
    svg.append(sv("text", { x: lx + 14, y: 15 }, s.name));
    lx += 20 + 7 * s.name.length;
  }
  return svg;
}
const clock = t => new Date(t * 1000).toLocaleTimeString();

// -- views -----------------------------------------------------------------------------------------
// one page of the active jobs (queuePage), with how many there are in all
async function queuePageOf() {
  const base = "/jobs?" + ACTIVE.map(s => `state=${s}`).join("&") + `&limit=${QUEUE_PAGE}&fields=${QUEUE_FIELDS}`;
  const at = queuePage.starts[queuePage.index];
  const page = await apiCall(at === null ? base : `${base}&after=${at}`);
  if (!page.body.length && queuePage.index > 0) {  // the jobs of this page ended: the first page
    queuePage = { starts: [null], index: 0 };
    return queuePageOf();
  }
  return page;
}

function pager(page) {
  const first = queuePage.index * QUEUE_PAGE + (page.body.length ? 1 : 0);
  const last = queuePage.index * QUEUE_PAGE + page.body.length;
  const prev = el("button", { id: "queue-prev", disabled: queuePage.index === 0, onclick: () => {
    queuePage.index -= 1; render(); } }, "‹ Previous");
  const next = el("button", { id: "queue-next", disabled: !page.next, onclick: () => {
    queuePage.starts[queuePage.index + 1] = page.next;
    queuePage.index += 1;
    render();
  } }, "Next ›");
  return el("div", { class: "pager", id: "queue-pager" },
    el("span", { id: "queue-range" }, `jobs ${first}–${last} of ${page.total ?? last}, by id`), prev, next);
}

async function overview(draw) {
  const [cluster, page, series] = await Promise.all([api("/cluster"), queuePageOf(), api(seriesUrl())]);
  const jobs = page.body;
  const nodes = el("div", { class: "cards", id: "cluster" }, cluster.nodes.map(n => el("div", { class: `card node${n.reason ? " drained" : ""}`, "data-node": n.name, "data-state": n.state },
    el("div", { class: "name" }, n.name, " ", el("span", { class: "meta" }, n.gpu_type)),
    n.reason ? el("div", { class: "drain-reason", title: n.state }, `${n.state}: ${n.reason}`) : null,
    el("div", { class: "gpus" }, n.slots.map(s => {
      const holders = s.jobs.map(j => j.id).join("+");
      const tip = (s.jobs.length ? s.jobs.map(j => `job ${j.id} (${j.user}: ${j.name})`).join(", ") : "idle")
        + (s.util === undefined ? "" : `; ${s.util}% used, memory ${gib(s.mem_used_mb)} of ${gib(s.mem_total_mb)}`
          + (s.power_w === null ? "" : `, ${s.power_w} W`) + (s.temp_c === null ? "" : `, ${s.temp_c} °C`));
      const attrs = { class: `gpu ${s.state}`, title: `GPU ${s.gpu}: ${tip}`, "data-gpu": s.gpu,
        "data-util": s.util === undefined ? null : s.util };
      return s.jobs.length ? el("a", { ...attrs, href: `#/job/${s.jobs[0].id}` }, holders) : el("div", attrs, s.gpu);
    })),
    el("div", { class: "meta" }, `GPUs ${n.gpus_allocated}/${n.gpus} allocated, ${n.gpus_busy} busy`),
    n.slots.some(s => s.util !== undefined)
      ? el("div", { class: "meta util" }, "util ", n.slots.map(s => s.util === undefined ? "-" : `${s.util}%`).join(" "))
      : null,
    el("div", { class: "meta" }, `cores ${n.cpus_used}/${n.cpus}, memory ${mem(n.mem_mb_used)}/${mem(n.mem_mb)}`))));
  const pts = series.map(p => [Date.parse(p.time) / 1000, p]);
  const util = lineChart("GPU utilisation (%)", [
    { name: "allocated", color: "#d69e2e", points: pts.map(([t, p]) => [t, 100 * p.allocated / Math.max(1, p.gpus)]) },
    { name: "busy", color: "#2f855a", points: pts.map(([t, p]) => [t, 100 * p.busy / Math.max(1, p.gpus)]) }],
    { yMax: 100, xLabel: clock, id: "utilisation" });
  const qlen = lineChart("Jobs", [
    { name: "pending", color: "#c53030", points: pts.map(([t, p]) => [t, p.pending]) },
    { name: "running", color: "#2b6cb0", points: pts.map(([t, p]) => [t, p.running]) }], { xLabel: clock, id: "queue-length" });
  const shown = jobs.filter(matches);
  const rows = collapse(shown).map(g => g.length === 1 ? jobRow(g[0]) : arrayRows(g)).flat();
  draw(
    el("h2", {}, `Cluster: ${cluster.gpus_allocated}/${cluster.gpus} GPUs allocated, ${cluster.gpus_busy} busy; `
      + `${cluster.jobs_running} running, ${cluster.jobs_pending} pending`),
    el("div", { class: "legend" }, el("span", { style: "background:#2f855a" }), "busy",
      el("span", { style: "background:#d69e2e" }), "allocated (launching or stopping)",
      el("span", { style: "background:#e2e8f0" }), "idle"),
    nodes,
    rangeBar(),
    el("div", { class: "charts" }, util, qlen),
    el("h2", { id: "queue-title" }, `Queue (${page.total ?? jobs.length} active jobs)`),
    pager(page),
    filterBar(jobs),
    el("table", { id: "queue" },
      el("thead", {}, el("tr", {}, ["JOBID", "ARRAY", "NAME", "USER", "QUEUE", "ST", "TIME", "GPUS", "ITER",
        "NODELIST(REASON)"].map(h => el("th", {}, h)))),
      el("tbody", {}, rows)));
}

function jobRow(j, extra) {
  return el("tr", { "data-job": j.id, class: extra || null },
    el("td", {}, jobLink(j.id)), el("td", {}, j.array || ""), el("td", {}, j.name), el("td", {}, j.user),
    el("td", {}, j.queue || "-"), el("td", { class: `st st-${j.st}`, title: j.state }, j.st),
    el("td", {}, dur(j.held_s)), el("td", {}, j.gpus), el("td", {}, j.progress === null ? "-" : j.progress),
    el("td", { class: "reason" }, reasonOf(j)));
}
// the filters (user, state, queue) and the search box (id, name, array, command words) on the page's jobs
function matches(j) {
  const q = filters.search.trim().toLowerCase();
  return (!filters.user || j.user === filters.user) && (!filters.state || j.st === filters.state)
    && (!filters.queue || (j.queue || "-") === filters.queue)
    && (!q || [j.id, j.name, j.array, j.user].some(v => v !== null && v !== undefined && String(v).toLowerCase().includes(q)));
}
function filterBar(jobs) {
  const pick = (key, values, label) => el("select", { id: `filter-${key}`, "aria-label": label, onchange: ev => {
    filters[key] = ev.target.value; render(); } },
    el("option", { value: "" }, `all ${label}s`),
    [...new Set(values)].sort().map(v => el("option", { value: v, selected: v === filters[key] }, v)));
  const search = el("input", { id: "filter-search", type: "search", placeholder: "search id, name, user",
    value: filters.search, "aria-label": "search" });
  search.addEventListener("change", () => { filters.search = search.value; render(); });
  return el("div", { class: "filters", id: "filters" }, pick("user", jobs.map(j => j.user), "user"),
    pick("state", jobs.map(j => j.st), "state"), pick("queue", jobs.map(j => j.queue || "-"), "queue"), search,
    el("span", { class: "meta" }, "(on this page of jobs)"));
}
// consecutive tasks of one array become one group (one row, expandable); other jobs a group each
function collapse(jobs) {
  const out = [];
  for (const j of jobs) {
    const last = out[out.length - 1];
    if (j.array_id !== undefined && j.array && last && last[0].array && arrayOf(last[0]) === arrayOf(j)) last.push(j);
    else out.push([j]);
  }
  return out;
}
function arrayOf(j) { return String(j.array).split("_")[0]; }
function arrayRows(tasks) {
  const a = arrayOf(tasks[0]), open = expanded.has(a);
  const count = {};
  for (const t of tasks) count[t.st] = (count[t.st] || 0) + 1;
  const states = Object.entries(count).map(([k, v]) => `${v} ${k}`).join(", ");
  const toggle = el("button", { class: "toggle", "data-array": a, title: open ? "collapse" : "show each task",
    onclick: () => { if (open) expanded.delete(a); else expanded.add(a); render(); } }, open ? "−" : "+");
  const first = tasks[0];
  const head = el("tr", { "data-array": a, class: "array" },
    el("td", {}, toggle, " ", jobLink(first.id, `${a}_[${tasks.map(t => t.array.split("_")[1]).join(",")}]`)),
    el("td", {}, `${tasks.length} tasks`), el("td", {}, first.name), el("td", {}, first.user),
    el("td", {}, first.queue || "-"), el("td", {}, states), el("td", {}, ""),
    el("td", {}, tasks.reduce((n, t) => n + Number(t.gpus || 0), 0)), el("td", {}, ""),
    el("td", { class: "reason" }, [...new Set(tasks.map(reasonOf).filter(Boolean))].join("; ")));
  return [head, ...(open ? tasks.map(t => jobRow(t, "task")) : [])];
}

async function jobPage(draw, id) {
  const job = await api(`/jobs/${id}`);
  const [events, allocs, gpus] = await Promise.all([api(`/jobs/${id}/events`), api(`/jobs/${id}/allocations`),
    api(`/jobs/${id}/gpus`)]);
  const mine = me && (me.admin || me.user === job.user);
  let progress = [], log = "";
  if (mine) [progress, log] = await Promise.all([api(`/jobs/${id}/progress`), api(`/jobs/${id}/logs?tail=6000`)]);
  const ended = ENDED.includes(job.state);
  // the page is drawn again every refresh: the answer is kept (jobMsg) and shown in whichever
  // message element is on the page when it comes
  const said = jobMsg.id === id ? jobMsg : { text: "", error: false };
  const msg = el("span", { class: said.error ? "msg error" : "msg", id: "job-msg" }, said.text);
  const show = (text, error) => {
    jobMsg = { id, text, error };
    const m = document.getElementById("job-msg");
    if (m) { m.textContent = text; m.className = error ? "msg error" : "msg"; }
  };
  const cancel = el("button", {
    class: "danger", id: "cancel", disabled: !mine || ended,
    title: !mine ? `only ${job.user} or an admin may cancel this job` : ended ? "the job has ended" : "cancel the job",
    onclick: async () => {
      cancel.disabled = true;
      try { const j = await api(`/jobs/${id}`, { method: "DELETE" }); show(`job ${id}: ${j.state}`, false); }
      catch (e) { show(e.message, true); }
    } }, "Cancel job");
  const spec = [["state", `${job.st} (${job.state})`], ["reason", jobReason(job)], ["user", job.user],
    ["queue", job.queue || "-"], ["array", job.array || "-"], ["dependency", job.dependency || "-"],
    ["command", job.command], ["gpus", job.gpus], ["cpus", job.cpus ?? "-"], ["memory", mem(job.mem_mb)],
    ["time limit", dur(job.time_limit)], ["submitted", when(job.submit_time)], ["started", when(job.first_start)],
    ["ended", when(job.end_time)], ["held", dur(job.held_s)], ["attempts", job.attempts],
    ["preemptions", job.preemptions], ["exit code", job.exit_code ?? "-"], ["iterations", job.progress ?? "-"],
    ["nodes", (job.nodes || []).join(",") || "-"]];
  if (job.st === "PD") spec.splice(2, 0, ["position", job.queue_position  // (from the backfill plan)
    ? `${job.queue_position} (${job.queue_position_in_queue} in its queue)` : "-"], ["est. start", when(job.est_start)]);
  const timed = progress.filter(p => p.t !== null);
  const chart = timed.length >= 1
    ? lineChart("Progress (iterations)", [{ name: "iter", color: "#2b6cb0", points: timed.map(p => [p.t, p.iter]) }],
      { xLabel: clock, id: "progress" })
    : lineChart("Progress (iterations, by line)", [{ name: "iter", color: "#2b6cb0",
      points: progress.map((p, i) => [i, p.iter]) }], { id: "progress" });
  const pre = el("pre", { class: "log", id: "log" }, mine ? log || "(empty)" : "(only the owner or an admin may read the log)");
  draw(
    el("h2", {}, `Job ${job.id}: ${job.name} `, cancel, msg),
    el("div", { class: "row" },
      el("div", {}, el("dl", { class: "spec", id: "spec" }, spec.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]))),
      el("div", {}, chart)),
    gpuSection(gpus),
    el("h2", {}, "Timeline"),
    el("table", { id: "timeline" }, el("thead", {}, el("tr", {}, ["TIME", "EVENT", "DETAIL"].map(h => el("th", {}, h)))),
      el("tbody", {}, events.map(e => el("tr", {}, el("td", {}, when(e.time)), el("td", {}, e.kind),
        el("td", { class: "reason detail" }, detailText(e.detail)))))),
    el("h2", {}, "Allocations"),
    el("table", { id: "allocations" }, el("thead", {}, el("tr", {}, ["FROM", "TO", "NODES", "GPUS", "CORES", "MEMORY", "BY"]
      .map(h => el("th", {}, h)))), el("tbody", {}, allocs.map(a => el("tr", {}, el("td", {}, when(a.start)),
      el("td", {}, a.end ? when(a.end) : "(holding)"), el("td", {}, a.nodes.join(",")),
      el("td", {}, Object.entries(a.local_gpus).map(([n, g]) => `${n}:${g.join(",")}`).join(" ")),
      el("td", {}, a.cpus), el("td", {}, mem(a.mem_mb)), el("td", {}, `${a.opened_by} → ${a.closed_by || ""}`))))),
    el("h2", {}, "Log (tail)"), pre);
  pre.scrollTop = pre.scrollHeight;
}

// the job's GPUs from NVML: each now, its totals, and a chart of its recent utilisation and memory
function gpuSection(g) {
  if (!g.now.length && !g.total) return null;
  const pts = g.series.map(p => [Date.parse(p.time) / 1000, p]);
  const t = g.total;
  const w = v => (v === null || v === undefined ? "-" : v);
  return el("div", { id: "gpu-telemetry" },
    el("h2", {}, "GPU telemetry"),
    t ? el("p", { id: "gpu-total" }, `utilisation mean ${w(t.gpu_util_mean)}%, max ${w(t.gpu_util_max)}%; `
      + `memory max ${gib(t.gpu_mem_max_mb)}; energy ${t.gpu_energy_wh === null ? "-" : t.gpu_energy_wh + " Wh"} `
      + `(${t.gpu_samples} samples)`) : null,
    el("div", { class: "row" },
      el("div", {}, el("table", { id: "gpu-now" }, el("thead", {}, el("tr", {}, ["NODE", "GPU", "UTIL", "MEMORY",
        "POWER", "TEMP"].map(h => el("th", {}, h)))), el("tbody", {}, g.now.map(r => el("tr", {},
        el("td", {}, r.node), el("td", {}, r.gpu), el("td", {}, `${r.util}%`),
        el("td", {}, `${gib(r.mem_used_mb)} / ${gib(r.mem_total_mb)}`),
        el("td", {}, r.power_w === null ? "-" : `${r.power_w} W`), el("td", {}, r.temp_c === null ? "-" : `${r.temp_c} °C`)))))),
      el("div", { class: "charts" },
        lineChart("GPU utilisation (%)", [{ name: "util", color: "#2f855a", points: pts.map(([x, p]) => [x, p.util]) }],
          { yMax: 100, xLabel: clock, id: "gpu-util", width: 360 }),
        lineChart("GPU memory (GiB)", [{ name: "used", color: "#2b6cb0",
          points: pts.map(([x, p]) => [x, p.mem_used_mb / 1024]) }], { xLabel: clock, id: "gpu-mem", width: 360 }))));
}

// each queue: its place in the tree, usage vs guarantee vs limit (now and over time), running and pending
async function queuesPage(draw) {
  const [q, series] = await Promise.all([api("/queues"), api(seriesUrl())]);
  if (!q.queues.length) {
    draw(el("h2", {}, "Queues"), el("p", { id: "no-queues" }, "This service runs without queues."));
    return;
  }
  const pts = series.map(p => [Date.parse(p.time) / 1000, p]);
  const limitOf = r => (r.limit.gpus === undefined ? "-" : r.limit.gpus);
  const rows = q.queues.map(r => el("tr", { "data-queue": r.name },
    el("td", { style: `padding-left:${8 + 18 * r.depth}px` }, r.depth ? "└ " : "", r.name, r.default ? " (default)" : ""),
    el("td", {}, r.parent || "-"), el("td", {}, r.used.gpus), el("td", {}, r.guarantee.gpus), el("td", {}, limitOf(r)),
    el("td", {}, r.borrowed), el("td", {}, r.running), el("td", {}, r.pending + (r.held || 0)),
    el("td", { class: "reason" }, Object.entries({ ...r.reasons, ...(r.held ? { "held (dependency, array limit)": r.held } : {}) })
      .map(([k, v]) => `${k}: ${v}`).join(", "))));
  const charts = q.queues.map(r => {
    const flat = v => pts.length ? [[pts[0][0], v], [pts[pts.length - 1][0], v]] : [];
    const lines = [{ name: "used", color: "#2f855a", points: pts.map(([x, p]) => [x, (p.queues || {})[r.name] || 0]) },
      { name: "guarantee", color: "#2b6cb0", points: flat(r.guarantee.gpus) }];
    if (r.limit.gpus !== undefined) lines.push({ name: "limit", color: "#c53030", points: flat(r.limit.gpus) });
    return lineChart(`${r.name} (GPUs)`, lines, { xLabel: clock, id: `queue-${r.name}`, width: 360, height: 150,
      yMax: Math.max(1, r.limit.gpus ?? 0, r.guarantee.gpus, ...pts.map(([, p]) => (p.queues || {})[r.name] || 0)) });
  });
  draw(
    el("h2", {}, `Queues (${q.policy})`),
    el("table", { id: "queues" }, el("thead", {}, el("tr", {}, ["QUEUE", "PARENT", "GPUS USED", "GUARANTEE", "LIMIT",
      "BORROWED", "RUNNING", "PENDING", "PENDING REASONS"].map(h => el("th", {}, h)))), el("tbody", {}, rows)),
    el("h2", {}, "Usage over time"), rangeBar(), el("div", { class: "charts", id: "queue-charts" }, charts));
}

async function historyPage(draw) {
  const recs = await apiPages("/history?since=7d");
  draw(el("h2", {}, `History (last 7 days, ${recs.length} jobs)`),
    el("table", { id: "history" }, el("thead", {}, el("tr", {}, ["JOBID", "NAME", "USER", "QUEUE", "ST", "SUBMIT", "START",
      "END", "ELAPSED", "GPUS", "GPU-HOURS", "EXIT", "REASON"].map(h => el("th", {}, h)))),
    el("tbody", {}, recs.reverse().map(r => el("tr", { "data-job": r.id }, el("td", {}, jobLink(r.id, r.array || r.id)),
      el("td", {}, r.name), el("td", {}, r.user), el("td", {}, r.queue || "-"), el("td", { class: `st st-${r.st}` }, r.st),
      el("td", {}, when(r.submit)), el("td", {}, when(r.start)), el("td", {}, when(r.end)), el("td", {}, dur(r.elapsed_s)),
      el("td", {}, r.gpus), el("td", {}, r.gpu_hours.toFixed(3)), el("td", {}, r.exit_code ?? "-"),
      el("td", { class: "reason" }, r.reason || ""))))));
}

// -- routing, login, refresh -----------------------------------------------------------------------
async function render() {
  clearTimeout(timer);
  const n = ++renders;
  const main = document.getElementById("main");
  const draw = (...kids) => { if (n === renders) main.replaceChildren(...kids); };
  const m = location.hash.match(/^#\/job\/(\d+)/);
  try {
    if (m) await jobPage(draw, m[1]);
    else if (location.hash.startsWith("#/history")) await historyPage(draw);
    else if (location.hash.startsWith("#/queues")) await queuesPage(draw);
    else await overview(draw);
    if (n !== renders) return;
    main.dataset.rendered = String(Date.now());
  } catch (e) {
    if (e.status === 401 || n !== renders) return;
    main.replaceChildren(el("p", { class: "error" }, e.message));
  }
  timer = setTimeout(render, REFRESH_MS);
}

function showLogin(err) {
  clearTimeout(timer);
  renders += 1;
  sessionStorage.removeItem(KEY);
  me = null;
  document.getElementById("main").replaceChildren();
  document.getElementById("login").hidden = false;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  document.getElementById("login-error").textContent = err || "";
}

async function start() {
  if (!sessionStorage.getItem(KEY)) return showLogin("");
  try { me = await api("/whoami"); } catch (e) { return; }
  document.getElementById("login").hidden = true;
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent = `${me.user}${me.admin ? " (admin)" : ""}`;
  render();
}

document.getElementById("login-form").addEventListener("submit", ev => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, document.getElementById("token").value.trim());
  document.getElementById("token").value = "";
  start();
});
document.getElementById("logout").addEventListener("click", () => showLogin(""));
window.addEventListener("hashchange", () => { if (me) render(); });
start();
