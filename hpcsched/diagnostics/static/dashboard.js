/* hpcsched dashboard: draws the scheduler's JSON snapshots on canvases and tables.
 *
 * The same script serves the live pages (it polls /api/*.json about once a
 * second while the tab is visible) and the performance report (its data is
 * inlined in a <script id="data"> element: the file opens offline).
 * Nothing is loaded from the network but the page's own server. Tasks are
 * drawn on canvases and summed per task group: there is never a DOM element
 * per task, so 100,000 tasks and 1,000 workers stay responsive.
 */
(function () {
  "use strict";
  const page = document.body.dataset.page;
  const main = document.getElementById("main");
  const inlined = document.getElementById("data");
  const REFRESH_MS = 1000;
  // task group colours; reds are kept for transfers and black for errors
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
    "#9c755f", "#86bcb6", "#8cd17d", "#499894", "#a0cbe8", "#ffbe7d", "#b6992d", "#79706e",
    "#6b6ecf", "#8ca252"];
  const TRANSFER = "#d62728";
  const STATE_COLORS = { done: "#3b5b7f", memory: "#59a14f", processing: "#4e79a7",
    queued: "#a0cbe8", "no-worker": "#edc948", waiting: "#d7dde4", erred: "#e15759" };

  // ------------------------------------------------------------ helpers
  function color(name) {
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return PALETTE[h % PALETTE.length];
  }
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "style") e.style.cssText = v; else e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined)
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return e;
  }
  function bytes(n) {
    if (n === null || n === undefined) return "-";
    const u = ["B", "kB", "MB", "GB", "TB", "PB"];
    let i = 0;
    while (Math.abs(n) >= 1000 && i < u.length - 1) { n /= 1000; i++; }
    return (i ? n.toFixed(n < 10 ? 2 : 1) : n.toFixed(0)) + " " + u[i];
  }
  function secs(s) {
    if (s < 1e-3) return (s * 1e6).toFixed(0) + " us";
    if (s < 1) return (s * 1e3).toFixed(1) + " ms";
    if (s < 120) return s.toFixed(2) + " s";
    return (s / 60).toFixed(1) + " min";
  }
  function num(n) { return n === null || n === undefined ? "-" : n.toLocaleString("en-US"); }
  function clock(t) { return new Date(t * 1000).toLocaleTimeString("en-GB"); }
  function card(k, v) { return el("div", { class: "card" }, el("div", { class: "v" }, v),
    el("div", { class: "k" }, k)); }
  function panel(title, ...kids) { return el("div", { class: "panel" }, el("h2", {}, title),
    ...kids); }
  function sized(canvas, height) {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(canvas.clientWidth || canvas.parentNode.clientWidth || 600, 200);
    canvas.style.height = height + "px";
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.font = "11px system-ui, sans-serif";
    return { ctx, w: width, h: height };
  }
  const tip = el("div", { class: "tip" });
  document.body.append(tip);
  function showTip(ev, text) {
    if (!text) { tip.style.display = "none"; return; }
    tip.textContent = text;
    tip.style.display = "block";
    tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 320) + "px";
    tip.style.top = ev.clientY + 12 + "px";
  }
  async function getJSON(url) {
    const r = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (!r.ok) throw new Error(url + ": " + r.status);
    return r.json();
  }

  // ------------------------------------------------------------ charts
  function bars(canvas, values, opts) {
    // one bar per item (or a histogram when there are many): values [[label, v, max?]]
    const { ctx, w, h } = sized(canvas, opts.height || 120);
    ctx.clearRect(0, 0, w, h);
    const top = 14, bottom = h - 14;
    ctx.fillStyle = "#5f6b7a";
    ctx.fillText(opts.title, 0, 10);
    if (!values.length) return;
    let items = values;
    let hist = false;
    if (values.length > 64) {  // a histogram: how many workers fall in each bin
      hist = true;
      const hi = opts.max || Math.max(...values.map(v => v[1]), 1e-9);
      const bins = new Array(20).fill(0);
      for (const v of values) bins[Math.min(19, Math.floor(20 * v[1] / hi))] += 1;
      items = bins.map((n, i) => [opts.fmt(hi * i / 20) + "-" + opts.fmt(hi * (i + 1) / 20), n]);
    }
    const max = hist ? Math.max(...items.map(v => v[1]), 1) :
      (opts.max || Math.max(...items.map(v => v[2] || v[1]), 1e-9));
    const bw = w / items.length;
    items.forEach((v, i) => {
      const hh = (bottom - top) * Math.min(v[1] / max, 1);
      if (!hist && v[2]) {
        ctx.fillStyle = "#eef1f4";
        ctx.fillRect(i * bw + 1, top, Math.max(bw - 2, 1), bottom - top);
      }
      ctx.fillStyle = opts.color || "#4e79a7";
      ctx.fillRect(i * bw + 1, bottom - hh, Math.max(bw - 2, 1), hh);
    });
    ctx.fillStyle = "#5f6b7a";
    ctx.fillText(hist ? "workers per bin (" + values.length + " workers)" :
      "max " + opts.fmt(max), 0, h - 2);
    canvas.onmousemove = ev => {
      const i = Math.floor((ev.offsetX) / bw);
      const v = items[i];
      showTip(ev, v ? v[0] + ": " + (hist ? v[1] + " workers" : opts.fmt(v[1])) : "");
    };
    canvas.onmouseleave = ev => showTip(ev, "");
  }

  function hbars(canvas, items, fmt) {
    // one labelled row per item: [[label, value]], longest first
    const rowH = 18, labelW = 180;
    const { ctx, w, h } = sized(canvas, Math.max(items.length * rowH + 4, 40));
    ctx.clearRect(0, 0, w, h);
    const max = Math.max(...items.map(v => v[1]), 1e-9);
    items.forEach(([label, v], i) => {
      const y = i * rowH + 2;
      ctx.fillStyle = "#1d2330";
      ctx.fillText(label.length > 28 ? label.slice(0, 27) + "…" : label, 0, y + 12);
      ctx.fillStyle = color(label);
      const bw = Math.max((w - labelW - 80) * v / max, 1);
      ctx.fillRect(labelW, y + 2, bw, rowH - 5);
      ctx.fillStyle = "#5f6b7a";
      ctx.fillText(fmt(v), labelW + bw + 6, y + 12);
    });
  }

  function lines(canvas, series, t0, t1, opts) {
    // series: [{name, color, points: [[t, v]]}]
    const { ctx, w, h } = sized(canvas, opts.height || 140);
    ctx.clearRect(0, 0, w, h);
    const top = 16, bottom = h - 16;
    let max = opts.max || 1e-9;
    for (const s of series) for (const p of s.points) max = Math.max(max, p[1]);
    const x = t => (t - t0) / Math.max(t1 - t0, 1e-9) * w;
    const y = v => bottom - (bottom - top) * v / max;
    ctx.strokeStyle = "#dde2e8";
    ctx.beginPath(); ctx.moveTo(0, bottom + 0.5); ctx.lineTo(w, bottom + 0.5); ctx.stroke();
    let lx = 0;
    for (const s of series) {
      ctx.strokeStyle = s.color; ctx.lineWidth = 1.5; ctx.beginPath();
      s.points.forEach((p, i) => i ? ctx.lineTo(x(p[0]), y(p[1])) : ctx.moveTo(x(p[0]), y(p[1])));
      ctx.stroke();
      ctx.fillStyle = s.color; ctx.fillText(s.name, lx, 11); lx += ctx.measureText(s.name).width + 14;
    }
    ctx.fillStyle = "#5f6b7a";
    ctx.fillText("max " + opts.fmt(max), w - 90, 11);
    ctx.fillText(clock(t0), 0, h - 3);
    ctx.fillText(clock(t1), w - 60, h - 3);
  }

  function taskStream(canvas, data, t0, t1, height) {
    // one row per worker thread, plus one per worker for its transfers (red)
    const rows = new Map();
    let n = 0;
    for (const [w, nthreads] of data.workers) { rows.set(w, n); n += nthreads + 1; }
    for (const t of data.tasks) if (!rows.has(t[0])) { rows.set(t[0], n); n += t[1] + 2; }
    for (const t of data.transfers) if (!rows.has(t[0])) { rows.set(t[0], n); n += 2; }
    const nthreadsOf = new Map(data.workers);
    const rowH = Math.max(1, Math.min(18, Math.floor((height || 360) / Math.max(n, 1))));
    const { ctx, w, h } = sized(canvas, Math.max(rowH * n + 16, 60));
    ctx.clearRect(0, 0, w, h);
    const x = t => (t - t0) / Math.max(t1 - t0, 1e-9) * w;
    const hit = [];  // [x0, x1, y0, y1, text] for the tooltip (tasks drawn >= 2 px only)
    const gap = rowH > 3 ? 1 : 0;
    for (const [worker, lane, group, key, s, e, kind] of data.tasks) {
      if (e < t0 || s > t1) continue;
      const y = rows.get(worker) * rowH + lane * rowH;
      const x0 = x(s), x1 = Math.max(x(e), x0 + 1);
      ctx.fillStyle = kind === "erred" ? "#000" : color(group);
      ctx.fillRect(x0, y, x1 - x0, rowH - gap);
      if (x1 - x0 >= 2) hit.push([x0, x1, y, y + rowH, key + " (" + group + ") on " + worker +
        ": " + secs(e - s) + (kind === "erred" ? ", erred" : "")]);
    }
    ctx.fillStyle = TRANSFER;
    for (const [worker, peer, s, e, nb] of data.transfers) {
      if (e < t0 || s > t1) continue;
      const base = rows.get(worker);
      const y = (base + (nthreadsOf.get(worker) || 1)) * rowH;
      const x0 = x(s), x1 = Math.max(x(e), x0 + 1);
      ctx.fillRect(x0, y, x1 - x0, rowH - gap);
      hit.push([x0, x1, y, y + rowH, "transfer " + bytes(nb) + " from " + peer + " to " +
        worker + ": " + secs(e - s)]);
    }
    ctx.fillStyle = "#5f6b7a";
    ctx.fillText(clock(t0), 0, h - 3);
    ctx.fillText(clock(t1), w - 60, h - 3);
    canvas.onmousemove = ev => {
      const m = hit.find(r => ev.offsetX >= r[0] && ev.offsetX <= r[1] &&
        ev.offsetY >= r[2] && ev.offsetY < r[3]);
      showTip(ev, m ? m[4] : "");
    };
    canvas.onmouseleave = ev => showTip(ev, "");
  }

  function groupLegend(tasks) {
    const total = new Map();
    for (const t of tasks) total.set(t[2], (total.get(t[2]) || 0) + (t[5] - t[4]));
    const top = [...total.entries()].sort((a, b) => b[1] - a[1]).slice(0, 24);
    return el("div", { class: "legend" }, ...top.map(([g, s]) =>
      el("span", {}, el("i", { style: "background:" + color(g) }), g + " " + secs(s))),
      el("span", {}, el("i", { style: "background:" + TRANSFER }), "transfer"),
      el("span", {}, el("i", { style: "background:#000" }), "erred"));
  }

  function progress(groups) {
    const grid = el("div", { class: "prog", id: "progress" });
    const order = ["done", "memory", "erred", "processing", "queued", "no-worker", "waiting"];
    for (const g of groups) {
      const total = Math.max(g.total, 1);
      const bar = el("div", { class: "bar", title: g.name });
      for (const s of order) if (g[s]) bar.append(el("span", {
        style: "width:" + (100 * g[s] / total) + "%;background:" + (s === "memory" ||
          s === "done" ? color(g.name) : STATE_COLORS[s]) + (s === "done" ? ";opacity:.55" : ""),
        title: s + ": " + g[s] }));
      const finished = g.done + g.memory;
      grid.append(el("div", { class: "name" }, g.name), bar, el("div", { class: "nums" },
        num(finished) + " / " + num(g.total) + (g.processing ? " · " + g.processing + " running"
          : "") + (g.erred ? " · " + g.erred + " erred" : "")));
    }
    return grid;
  }

  const sorting = {};  // table id -> [key, ascending]: kept across refreshes
  const filters = {};  // table id -> its filter box, kept across refreshes (and its focus)
  const MAX_ROWS = 250;  // rows drawn at most: sort or filter to find the others
  function table(columns, rows, sortKey, id) {
    // columns: [[title, key, format]]; click a header to sort
    let [key, asc] = sorting[id] || [sortKey, false];
    const wrap = el("div", { id: id || "" });
    const box = filters[id] || (filters[id] = el("input", { type: "search",
      placeholder: "filter", style: "margin:4px 0;width:240px" }));
    const note = el("span", { class: "muted", style: "margin-left:8px" });
    const holder = el("div");
    box.oninput = () => draw();
    wrap.append(el("div", {}, box, note), holder);
    function draw() {
      sorting[id] = [key, asc];
      const needle = box.value.trim().toLowerCase();
      const kept = needle ? rows.filter(r => columns.some(([, k]) =>
        String(r[k] ?? "").toLowerCase().includes(needle))) : rows;
      const sorted = kept.slice().sort((a, b) => {
        const x = a[key], y = b[key];
        const c = (x === null || x === undefined) ? -1 : (y === null || y === undefined) ? 1 :
          (typeof x === "number" ? x - y : String(x).localeCompare(String(y), "en",
            { numeric: true }));
        return asc ? c : -c;
      });
      const head = el("tr", {}, ...columns.map(([title, k]) => {
        const th = el("th", { class: k === key ? "sorted" + (asc ? " asc" : "") : "" }, title);
        th.onclick = () => { if (key === k) asc = !asc; else { key = k; asc = true; } draw(); };
        return th;
      }));
      note.textContent = sorted.length > MAX_ROWS ? "first " + MAX_ROWS + " of " +
        num(sorted.length) + " rows" : num(sorted.length) + " rows";
      const body = sorted.slice(0, MAX_ROWS).map(r => el("tr", {}, ...columns.map(([, k, f, cls]) =>
        el("td", cls ? { class: cls } : {}, f ? f(r[k], r) : (r[k] ?? "-")))));
      holder.replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, ...body)));
    }
    draw();
    return wrap;
  }

  // ------------------------------------------------------------ live pages
  const state = { sort: null };
  const WORKER_COLUMNS = [["address", "address"], ["name", "name"], ["host", "host"],
    ["MPI rank", "rank"], ["job id", "job_id"], ["resources", "resources"],
    ["threads", "nthreads", num],
    ["cpu %", "cpu", v => v === null ? "-" : v.toFixed(0)],
    ["memory", "memory", bytes], ["managed", "managed", bytes], ["limit", "memory_limit", bytes],
    ["processing", "processing", num], ["executing", "executing", num], ["keys", "n_keys", num],
    ["last seen", "last_seen", (v, r) => v ? ((r.now - v) < 1 ? "now" :
      secs(r.now - v) + " ago") : "-"], ["status", "status"]];

  function renderStatus(s) {
    const mem = s.memory_limit ? bytes(s.memory) + " / " + bytes(s.memory_limit) : bytes(s.memory);
    const cards = el("div", { class: "cards", id: "cards" },
      card("workers", num(s.n_workers)), card("threads", num(s.nthreads)),
      card("processing", num(s.processing)), card("tasks / s", s.tasks_per_second.toFixed(1)),
      card("finished", num(s.n_finished)), card("erred", num(s.n_erred)),
      card("memory (process)", mem), card("memory (managed)", bytes(s.managed)),
      card("bandwidth (estimate)", bytes(s.bandwidth) + "/s"),
      card("transferred", bytes(s.bytes_transferred)));
    const cpu = el("canvas"), memc = el("canvas"), proc = el("canvas"), hist = el("canvas");
    main.replaceChildren(cards,
      panel("Progress by task group (" + s.n_groups + " groups, " + num(s.n_tasks) +
        " tasks held)", progress(s.groups)),
      el("div", { class: "grid2" }, panel("Workers' CPU", cpu), panel("Workers' memory", memc),
        panel("Tasks processing per worker", proc), panel("Memory over time", hist)));
    const ws = s.workers;
    bars(cpu, ws.map(w => [w.name, w.cpu || 0]), { title: "CPU % per worker", fmt: v =>
      v.toFixed(0) + " %", max: 100 * Math.max(1, ...ws.map(w => w.nthreads)) });
    const limit = Math.max(0, ...ws.map(w => w.memory_limit || 0));
    bars(memc, ws.map(w => [w.name, w.memory || w.managed]), {
      title: "process memory per worker" + (limit ? " (limit " + bytes(limit) + ")" : ""),
      fmt: bytes, color: "#59a14f" });
    bars(proc, ws.map(w => [w.name, w.processing]), { title: "tasks processing per worker",
      fmt: num, color: "#f28e2b" });
    const sm = s.samples || [];
    if (sm.length > 1) lines(hist, [
      { name: "process", color: "#59a14f", points: sm.map(p => [p[0], p[1]]) },
      { name: "managed", color: "#4e79a7", points: sm.map(p => [p[0], p[2]]) }],
      sm[0][0], sm[sm.length - 1][0], { fmt: bytes });
  }

  // the task stream page keeps the last minute here and asks only for what is new
  const stream = { tasks: [], transfers: [], taskCount: -1, transferCount: -1, workers: [] };
  function streamURL() {
    return "api/task-stream.json?tasks=" + stream.taskCount + "&transfers=" +
      stream.transferCount;
  }
  function renderTasks(d) {
    const names = d.names, groups = d.groups;
    for (const [wi, lane, gi, key, t0, dur, erred] of d.tasks) {
      const s = d.base + t0 / 1e3;
      stream.tasks.push([names[wi], lane, groups[gi], key, s, s + dur / 1e6,
        erred ? "erred" : "compute"]);
    }
    for (const [wi, pi, t0, dur, nb] of d.transfers) {
      const s = d.base + t0 / 1e3;
      stream.transfers.push([names[wi], names[pi], s, s + dur / 1e6, nb]);
    }
    stream.taskCount = d.task_count;
    stream.transferCount = d.transfer_count;
    const t1 = d.time, cut = t1 - 60;
    if (stream.tasks.length && stream.tasks[0][5] < cut)
      stream.tasks = stream.tasks.filter(t => t[5] >= cut);
    if (stream.transfers.length && stream.transfers[0][3] < cut)
      stream.transfers = stream.transfers.filter(t => t[3] >= cut);
    const view = { tasks: stream.tasks, transfers: stream.transfers, workers: d.workers };
    const c = el("canvas", { id: "stream" });
    main.replaceChildren(panel("Task stream: up to the last minute, one row per worker thread " +
      "(" + num(view.tasks.length) + " tasks, " + num(view.transfers.length) + " transfers)",
      groupLegend(view.tasks), c));
    // the last minute, or less when the cluster has not run that long
    let first = t1 - 5;
    for (const t of view.tasks) first = Math.min(first, t[4]);
    taskStream(c, view, Math.max(cut, first), t1, Math.max(window.innerHeight - 180, 240));
  }

  function renderWorkers(s) {
    for (const w of s.workers) w.now = s.time;
    main.replaceChildren(panel(s.n_workers + " workers, " + s.nthreads + " threads",
      table(WORKER_COLUMNS, s.workers, "address", "workers")));
  }

  function eventsTable(evs) {
    return table([["time", "t", clock], ["event", "topic"], ["what", "text", null, "wrap"]],
      evs.map(e => ({ t: e[0], topic: e[1], text: e[2] })), "t", "events");
  }

  function renderEvents(evs) {
    main.replaceChildren(panel("Scheduler events (" + evs.length + ")", eventsTable(evs)));
  }

  const LIVE = { status: ["api/status.json", renderStatus],
    tasks: [streamURL, renderTasks], workers: ["api/status.json", renderWorkers],
    events: ["api/events.json", renderEvents] };

  async function poll() {
    const [url, render] = LIVE[page];
    if (!document.hidden) {
      try {
        render(await getJSON("/" + (typeof url === "function" ? url() : url)));
        document.getElementById("clock").textContent = "updated " + clock(Date.now() / 1000);
        main.dataset.updates = String(Number(main.dataset.updates || 0) + 1);
      } catch (e) {
        document.getElementById("clock").textContent = "no answer: " + e.message;
      }
    }
    setTimeout(poll, REFRESH_MS);
  }

  // ------------------------------------------------------------ performance report
  function utilization(tasks, workers, t0, t1, nbins) {
    const threads = workers.reduce((a, w) => a + w[1], 0) || 1;
    const width = Math.max(t1 - t0, 1e-9) / nbins;
    const busy = new Array(nbins).fill(0);
    for (const t of tasks) {
      if (t[6] === "transfer") continue;
      let s = Math.max(t[4], t0), e = Math.min(t[5], t1);
      for (let b = Math.floor((s - t0) / width); s < e && b < nbins; b++) {
        const end = Math.min(e, t0 + (b + 1) * width);
        busy[Math.max(b, 0)] += end - s;
        s = end;
      }
    }
    return busy.map((v, i) => [t0 + (i + 0.5) * width, 100 * v / (width * threads)]);
  }

  function renderReport(r) {
    const t0 = r.tasks.length ? Math.min(r.start, ...r.tasks.slice(0, 1).map(t => t[4])) :
      r.start;
    const t1 = r.stop, dur = t1 - t0;
    const per = new Map();
    for (const t of r.tasks) {
      const g = per.get(t[2]) || { n: 0, s: 0, erred: 0 };
      g.n += 1; g.s += t[5] - t[4]; if (t[6] === "erred") g.erred += 1;
      per.set(t[2], g);
    }
    const groups = [...per.entries()].sort((a, b) => b[1].s - a[1].s);
    const compute = groups.reduce((a, g) => a + g[1].s, 0);
    const moved = r.transfers.reduce((a, t) => a + t[4], 0);
    const threads = r.workers.reduce((a, w) => a + w[1], 0);
    const stream = el("canvas", { id: "stream" }), util = el("canvas", { id: "utilization" }),
      pergroup = el("canvas", { id: "groups" });
    const byPair = new Map();
    for (const t of r.transfers) {
      const k = t[1] + " → " + t[0];
      const v = byPair.get(k) || { n: 0, b: 0, s: 0 };
      v.n += 1; v.b += t[4]; v.s += t[3] - t[2]; byPair.set(k, v);
    }
    main.replaceChildren(
      el("h2", {}, "Performance report: " + r.address + ", " + clock(t0) + " to " + clock(t1)),
      el("div", { class: "cards", id: "cards" }, card("duration", secs(dur)),
        card("tasks", num(r.tasks.length)), card("compute time", secs(compute)),
        card("workers", num(r.workers.length)), card("threads", num(threads)),
        card("utilization", (100 * compute / Math.max(dur * threads, 1e-9)).toFixed(0) + " %"),
        card("transfers", num(r.transfers.length) + " · " + bytes(moved)),
        card("erred", num(r.tasks.filter(t => t[6] === "erred").length))),
      panel("Task stream", groupLegend(r.tasks), stream),
      el("div", { class: "grid2" }, panel("Time per task group", pergroup),
        panel("Worker utilization over time (% of threads busy)", util)),
      panel("Transfers (" + num(r.transfers.length) + ", " + bytes(moved) + ")",
        table([["from → to", "k"], ["count", "n", num], ["bytes", "b", bytes],
          ["seconds", "s", secs], ["rate", "r", v => bytes(v) + "/s"]],
          [...byPair.entries()].map(([k, v]) => ({ k, n: v.n, b: v.b, s: v.s,
            r: v.b / Math.max(v.s, 1e-9) })), "b", "transfers")),
      panel("Task groups", table([["group", "g"], ["tasks", "n", num], ["time", "s", secs],
        ["mean", "m", secs], ["erred", "e", num]], groups.map(([g, v]) => ({ g, n: v.n, s: v.s,
          m: v.s / v.n, e: v.erred })), "s", "group-table")),
      panel("Scheduler events (" + r.events.length + ")", eventsTable(r.events)));
    taskStream(stream, r, t0, t1, 420);
    hbars(pergroup, groups.slice(0, 40).map(([g, v]) => [g, v.s]), secs);
    const u = utilization(r.tasks, r.workers, t0, t1, 100);
    lines(util, [{ name: "busy threads %", color: "#4e79a7", points: u }], t0, t1, {
      fmt: v => v.toFixed(0) + " %", max: 100, height: 160 });
    document.getElementById("clock").textContent = "written " + clock(t1);
    main.dataset.updates = "1";
  }

  if (inlined) renderReport(JSON.parse(inlined.textContent));
  else if (LIVE[page]) poll();
})();
