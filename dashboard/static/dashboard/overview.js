// Overview, live: draw from a snapshot first, then apply websocket updates.
// Every live trace says in `meta` which series feeds it (see dashboard/figures.py).
// While the tab is hidden the socket is closed; on return the snapshot is reloaded.
(function () {
  "use strict";
  const root = document.getElementById("overview");
  const SNAPSHOT_URL = root.dataset.snapshotUrl;
  const WS_PATH = root.dataset.wsPath;
  const MAX_POINTS = 400;
  const PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d"];

  const state = { points: new Map(), fleet: new Map(), evictions: new Map(), marks: [] };
  const live = { updates: 0, socket: null, status: "connecting", retryMs: 1000, draws: 0 };
  window.kvrouteDashboard = live;

  const charts = Array.from(document.querySelectorAll("[data-figure]")).map(function (div) {
    div.dataset.live = "1";
    return { div: div, fig: window.kvrouteCharts.figureOf(div) };
  });

  function trim(map) {
    const keys = Array.from(map.keys()).sort();
    while (keys.length > MAX_POINTS) map.delete(keys.shift());
  }

  function sorted(map) {
    return Array.from(map.values()).sort(function (a, b) { return a.t < b.t ? -1 : a.t > b.t ? 1 : 0; });
  }

  // Idle stretches have no points; a null between two points far apart breaks the line
  // so the chart does not draw traffic that never happened.
  const GAP_MS = 60 * 1000;
  function withGaps(pts) {
    const out = [];
    let prev = null;
    pts.forEach(function (p) {
      const ms = Date.parse(p.t);
      if (prev !== null && ms - prev > GAP_MS) out.push({ t: new Date(prev + 1000).toISOString(), gap: true });
      out.push(p);
      prev = ms;
    });
    return out;
  }

  function seriesFor(meta) {
    if (meta.src === "overview") return sorted(state.points);
    if (meta.src === "evictions") return sorted(state.evictions);
    if (meta.src === "fleet") return sorted(state.fleet.get(meta.worker) || new Map());
    return [];
  }

  function redraw() {
    charts.forEach(function (c) {
      const fig = c.fig;
      const perWorker = fig.layout.meta && fig.layout.meta.per_worker;
      if (perWorker) {
        const have = new Set(fig.data.map(function (t) { return t.meta.worker; }));
        Array.from(state.fleet.keys()).sort().forEach(function (w) {
          if (have.has(w)) return;
          const color = PALETTE[fig.data.length % PALETTE.length];
          fig.data.push({ type: "scatter", mode: "lines+markers", name: w, x: [], y: [],
            line: { color: color, width: 2 }, marker: { size: 4 },
            meta: { src: "fleet", worker: w, field: perWorker } });
        });
      }
      fig.data.forEach(function (trace) {
        if (!trace.meta) return;
        const pts = withGaps(seriesFor(trace.meta));
        trace.x = pts.map(function (p) { return p.t; });
        trace.y = pts.map(function (p) { return p.gap ? null : p[trace.meta.field]; });
        trace.connectgaps = false;
      });
      // Policy activations as dotted vertical lines on every time-series chart.
      fig.layout.shapes = state.marks.map(function (m) {
        return { type: "line", xref: "x", yref: "paper", x0: m.t, x1: m.t, y0: 0, y1: 1,
          line: { color: "#7c3aed", width: 1, dash: "dot" } };
      });
      fig.layout.annotations = state.marks.map(function (m) {
        return { x: m.t, xref: "x", yref: "paper", y: 1, yanchor: "bottom", text: m.text,
          showarrow: false, font: { size: 10, color: "#7c3aed" } };
      });
      fig.layout.datarevision = (fig.layout.datarevision || 0) + 1;
      window.kvrouteCharts.draw(c.div, fig);
    });
    live.draws += 1;
    updateKpis();
  }

  function fmt(v, kind) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    if (kind === "pct") return (100 * v).toFixed(1) + " %";
    if (kind === "ms") return v >= 1000 ? (v / 1000).toFixed(2) + " s" : v.toFixed(0) + " ms";
    return v.toFixed(v >= 100 ? 0 : 2);
  }

  function updateKpis() {
    const pts = sorted(state.points);
    const last = pts[pts.length - 1] || {};
    const ev = sorted(state.evictions);
    const lastEv = ev[ev.length - 1] || {};
    let waiting = 0, kv = 0, n = 0;
    state.fleet.forEach(function (m) {
      const s = sorted(m); const p = s[s.length - 1];
      if (p) { waiting += p.waiting || 0; kv += p.kv_usage_frac || 0; n += 1; }
    });
    const set = function (id, text) { const el = document.getElementById(id); if (el) el.textContent = text; };
    set("kpi-rps", fmt(last.rps));
    set("kpi-ttft", fmt(last.ttft_p95_ms, "ms"));
    set("kpi-ttft-sub", "p50 " + fmt(last.ttft_p50_ms, "ms") + " · p99 " + fmt(last.ttft_p99_ms, "ms"));
    set("kpi-hit", fmt(last.hit_rate_actual, "pct"));
    set("kpi-hit-sub", "predicted " + fmt(last.hit_rate_predicted, "pct"));
    set("kpi-prederr", fmt(last.prediction_error_frac, "pct"));
    set("kpi-evict", fmt(lastEv.evictions_per_s));
    set("kpi-queue", n ? String(waiting) : "–");
    set("kpi-queue-sub", n ? "mean KV usage " + fmt(kv / n, "pct") : "no worker scraped yet");
    set("kpi-updates", String(live.updates));
  }

  function setStatus(status) {
    live.status = status;
    const dot = document.getElementById("live-dot");
    const label = document.getElementById("live-label");
    if (dot) dot.className = "live-dot" + (status === "live" ? " on" : status === "paused" ? " paused" : "");
    if (label) label.textContent = status;
  }

  function applyOverview(points) {
    points.forEach(function (p) { state.points.set(p.t, p); });
    trim(state.points);
  }

  function applyFleet(points, evictions) {
    points.forEach(function (p) {
      if (!state.fleet.has(p.worker_id)) state.fleet.set(p.worker_id, new Map());
      const m = state.fleet.get(p.worker_id);
      m.set(p.t, p);
      trim(m);
    });
    (evictions || []).forEach(function (e) { if (e.t) state.evictions.set(e.t, e); });
    trim(state.evictions);
  }

  function loadSnapshot() {
    return fetch(SNAPSHOT_URL, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { if (!r.ok) throw new Error("snapshot " + r.status); return r.json(); })
      .then(function (snap) {
        state.points.clear(); state.fleet.clear(); state.evictions.clear();
        applyOverview(snap.points || []);
        Object.keys(snap.fleet || {}).forEach(function (w) { applyFleet(snap.fleet[w], []); });
        (snap.evictions || []).forEach(function (e) { state.evictions.set(e.t, e); });
        state.marks = snap.marks || [];
        redraw();
      })
      .catch(function (err) { setStatus("snapshot failed"); console.error(err); });
  }

  function connect() {
    if (document.hidden) return;
    const proto = location.protocol === "https:" ? "wss://" : "ws://";
    const ws = new WebSocket(proto + location.host + WS_PATH);
    live.socket = ws;
    ws.onopen = function () { live.retryMs = 1000; setStatus("live"); };
    ws.onmessage = function (ev) {
      const msg = JSON.parse(ev.data);
      if (msg.kind === "overview") { applyOverview(msg.points || []); }
      else if (msg.kind === "fleet") { applyFleet(msg.points || [], msg.evictions); }
      else { return; }
      live.updates += 1;
      redraw();
    };
    ws.onclose = function () {
      if (live.socket !== ws) return;
      live.socket = null;
      if (document.hidden) return;
      setStatus("reconnecting");
      setTimeout(connect, live.retryMs);
      live.retryMs = Math.min(live.retryMs * 2, 15000);
    };
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      setStatus("paused");
      const ws = live.socket; live.socket = null;
      if (ws) ws.close();
    } else {
      loadSnapshot().then(connect);
    }
  });

  redraw();
  loadSnapshot().then(connect);
})();
