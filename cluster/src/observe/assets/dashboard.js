// The dashboard page: one EventSource on /events (observe/dashboard.rs rule 1); the first
// message is the whole state, then one update per sample. Charts are uPlot (vendored).
"use strict";
(function () {
  const token = document.body.dataset.token;
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const color = (w) => palette[(w - 1) % palette.length];
  const MAX = 1200;

  let lastN = -1;
  let samples = [];
  let throughput = null;
  let load = null;
  let loadWorkers = "";

  function width(el) { return Math.max(300, el.clientWidth - 4); }

  function drawThroughput() {
    const t = samples.map((s) => s.t);
    const y = samples.map((s) => s.tasks_per_s);
    if (!throughput) {
      const el = $("throughput");
      throughput = new uPlot({
        width: width(el), height: 220,
        scales: { x: { time: false } },
        axes: [{ label: "s" }, { label: "tasks/s" }],
        series: [{ label: "t (s)" }, { label: "tasks/s", stroke: "#1f77b4", fill: "rgba(31,119,180,0.1)" }],
      }, [t, y], el);
    } else {
      throughput.setData([t, y]);
    }
  }

  // Per-worker tasks/s from the differences of its task counts between samples.
  function drawLoad() {
    const ids = [...new Set(samples.flatMap((s) => Object.keys(s.workers)))].map(Number).sort((a, b) => a - b);
    const t = samples.map((s) => s.t);
    const data = [t];
    for (const id of ids) {
      data.push(samples.map((s, i) => {
        if (i === 0) return null;
        const p = samples[i - 1];
        const a = p.workers[id], b = s.workers[id];
        // A worker that adopted vnodes counts their rebuilt tasks at once: no rate there.
        if (a === undefined || b === undefined || s.t <= p.t || s.adopted.includes(id)) return null;
        return Math.max(0, b - a) / (s.t - p.t);
      }));
    }
    const key = ids.join(",");
    if (!load || key !== loadWorkers) {
      if (load) load.destroy();
      const el = $("load");
      el.innerHTML = "";
      loadWorkers = key;
      load = new uPlot({
        width: width(el), height: 220,
        scales: { x: { time: false } },
        axes: [{ label: "s" }, { label: "tasks/s" }],
        series: [{ label: "t (s)" }].concat(ids.map((id) => ({ label: "worker " + id, stroke: color(id) }))),
      }, data, el);
    } else {
      load.setData(data);
    }
  }

  function render(m) {
    const st = m.status || {};
    $("coordinator").textContent = st.coordinator || "";
    $("role").textContent = st.role === "active" ? "active, term 0x" + (st.term || 0).toString(16) + (st.took_over ? " (took over)" : "") : (st.role || "");
    const jobs = st.jobs || [];
    const ended = (j) => j.state === "finished" || j.state === "failed" || j.state === "cancelled";
    const live = jobs.filter((j) => !ended(j) && j.state !== "queued");
    const queued = jobs.filter((j) => j.state === "queued").length;
    $("job").textContent = (live.length === 0 ? "no job" : live.map((j) => "job " + j.id + " (" + j.program + "): " + j.state + ", " + j.tasks_completed + " tasks, " + j.elapsed_s.toFixed(1) + " s").join("; ")) + (queued ? `; ${queued} queued` : "");
    const c = m.counters || {};
    $("c-tasks").textContent = c.tasks || 0;
    const last = samples[samples.length - 1];
    $("c-rate").textContent = last ? Math.round(last.tasks_per_s) : 0;
    for (const k of ["failures", "recoveries", "suspicions", "takeovers", "forgeries"]) $("c-" + k).textContent = c[k] || 0;
    const wc = m.worker_counters || {};
    $("c-steals").textContent = Object.values(wc).reduce((a, w) => a + w.steals, 0);

    const rows = (st.workers || []).map((w) => {
      const heard = w.last_heard_ago_s == null ? "-" : w.last_heard_ago_s.toFixed(1) + " s ago";
      const steals = wc[w.id] ? wc[w.id].steals : 0;
      return `<tr data-worker="${w.id}" class="${w.detector === "alive" ? "" : "suspect"}"><td style="color:${color(w.id)}">${w.id}${w.spare ? " (spare)" : ""}</td><td>${esc(w.addr)}</td><td>${w.threads}</td><td>${w.vnodes}</td><td>${w.tasks_completed || 0}</td><td>${steals}</td><td>${esc(w.detector)}</td><td>${heard}</td></tr>`;
    });
    $("workers").tBodies[0].innerHTML = rows.join("");

    const maps = live.filter((j) => (j.map || []).length > 0);
    $("vnode-map").innerHTML = maps.length === 0 ? '<span class="muted">no job running</span>' :
      maps.map((j) => (maps.length > 1 ? `<span class="muted">job ${j.id}:</span> ` : "") + j.map.map((v) => `<span class="vnode${v.epoch > 0 ? " moved" : ""}" data-job="${j.id}" data-vnode="${v.vnode}" data-worker="${v.worker}" data-epoch="${v.epoch}" style="background:${color(v.worker)}">v${v.vnode} → w${v.worker} @${v.epoch}</span>`).join("")).join("<br>");

    const lj = jobs.filter(ended).pop();
    if (lj) {
      $("job-end").className = "";
      $("job-end").dataset.state = lj.state;
      $("job-end").textContent = lj.error ? `job ${lj.id} ${lj.state}: ${lj.error}` :
        `job ${lj.id} ${lj.state}: ${lj.tasks_completed} tasks in ${lj.elapsed_s.toFixed(2)} s, ${lj.workers_lost} workers lost`;
    }
    const cert = m.certification;
    $("certification").textContent = cert == null ? "none (no online oracle)" : `job ${cert.job}: ${cert.decision}`;
    $("certification").dataset.decision = cert == null ? "" : cert.decision;
  }

  function addEvents(events) {
    const ul = $("timeline");
    for (const e of events) {
      const li = document.createElement("li");
      li.dataset.kind = e.kind;
      li.innerHTML = `<span class="t">${e.t.toFixed(1)} s</span><span class="k">${esc(e.kind)}</span>${esc(e.text)}`;
      ul.insertBefore(li, ul.firstChild);
    }
    while (ul.children.length > 500) ul.removeChild(ul.lastChild);
  }

  function onMessage(m) {
    if (m.full) {
      samples = m.samples.slice();
      $("timeline").innerHTML = "";
      addEvents(m.events);
      lastN = samples.length ? samples[samples.length - 1].n : lastN;
    } else {
      const s = m.samples[0];
      if (s && s.n <= lastN) return; // already in the whole state (rule 1)
      if (s) { samples.push(s); lastN = s.n; }
      if (samples.length > MAX) samples.splice(0, samples.length - MAX);
      addEvents(m.events);
    }
    render(m);
    drawThroughput();
    drawLoad();
    document.body.dataset.updates = String(Number(document.body.dataset.updates) + 1);
  }

  const es = new EventSource("/events?token=" + encodeURIComponent(token));
  es.onopen = () => { $("live").textContent = "live"; $("live").className = "live on"; };
  es.onerror = () => { $("live").textContent = "disconnected"; $("live").className = "live"; };
  es.onmessage = (ev) => onMessage(JSON.parse(ev.data));
})();
