/* The tenant dashboard: spend against budget (pacing), latency by class, the autobidder's
 * multiplier and recent requests, updated by spend ticks (market/payloads.py: SpendTick). */
"use strict";

(function () {
  const initial = JSON.parse(document.getElementById("initial").textContent);
  const $ = (id) => document.getElementById(id);
  const REQUESTS_SHOWN = 25;
  const LATENCY_WINDOW_S = 3600;
  const CLASS_COLORS = ["#5b8cff", "#e08a2e", "#38a67a", "#a05bd6", "#d64545"];

  const state = {
    tick: initial.tick,
    pacing: initial.pacing,
    latency: initial.latency,
    latencySeen: new Set(initial.latency.map((p) => p.id)),
    requests: new Map(initial.requests.map((r) => [r.request_id, r])),
    mu: initial.autobidder.steps,
    dirty: {pacing: true, latency: true, mu: true},
  };

  // --- spend ---------------------------------------------------------------------------------
  function renderSpend() {
    const t = state.tick;
    const b = t.budget;
    $("kpi-today").textContent = fmt.dollars(t.spent_today);
    if (b) {
      $("kpi-window-label").textContent = `Spent this ${b.period === "none" ? "budget" : b.period}`;
      $("kpi-spent").textContent = fmt.dollars(b.spent);
      $("kpi-limit").textContent = `of ${fmt.dollars(b.limit)} budget`;
      $("kpi-remaining").textContent = fmt.dollars(b.remaining);
      $("kpi-held").textContent = `${fmt.dollars(b.held)} held in flight`;
      $("kpi-held").title = "reserved for requests in flight (their worst case)";
      const share = Number(b.limit) > 0 ? Math.min(1, Number(b.spent) / Number(b.limit)) : 0;
      const meter = $("kpi-meter");
      meter.style.width = `${(share * 100).toFixed(1)}%`;
      meter.className = meterClass(share);
    } else {
      $("kpi-window-label").textContent = "Spent this month";
      $("kpi-spent").textContent = fmt.dollars(t.spent_window);
      $("kpi-limit").textContent = "no budget: spending is not capped";
      $("kpi-remaining").textContent = "∞";
      $("kpi-held").textContent = "no budget";
    }
    if (t.autobidder) $("kpi-mu").textContent = fmt.figure(t.autobidder.mu);
    renderReset();
  }

  function renderReset() {
    const b = state.tick.budget;
    if (!b || !b.resets_at) {
      $("kpi-reset").textContent = "never";
      $("kpi-reset-at").textContent = b ? "this budget does not reset" : "";
      return;
    }
    $("kpi-reset").textContent = fmt.duration(Math.max(0, b.resets_at - Date.now() / 1000));
    $("kpi-reset-at").textContent = fmt.date(b.resets_at);
  }

  function renderPacing() {
    const p = state.pacing;
    const now = Date.now() / 1000;
    const actual = [[p.start, "0"], ...p.points];
    const traces = [{
      type: "scatter", mode: "lines", name: "actual spend $", line: {color: "#5b8cff", width: 2.5, shape: "hv"},
      x: actual.map((q) => unixDate(q[0])), y: actual.map((q) => Number(q[1])),
      hovertext: actual.map((q) => fmt.dollars(q[1])), hovertemplate: "%{hovertext}",
    }];
    if (p.limit !== null) {
      traces.unshift({
        type: "scatter", mode: "lines", name: "even pace $", line: {color: "#9aa3b5", width: 1.5, dash: "dash"},
        x: [unixDate(p.start), unixDate(p.end)], y: [0, Number(p.limit)], hoverinfo: "skip",
      });
    }
    $("pacing-note").textContent = p.limit !== null
      ? `this ${p.period}, vs an even pace to ${fmt.dollars(p.limit)}` : "this month (no budget)";
    Plotly.react("chart-pacing", traces, layout({
      xaxis: {range: [unixDate(p.start), unixDate(p.end)]},
      yaxis: {...ruledTicks([...actual.map((q) => q[1]), p.limit]), title: {text: "$", standoff: 4}},
      shapes: [{type: "line", x0: unixDate(now), x1: unixDate(now), yref: "paper", y0: 0, y1: 1,
                line: {color: "#c93c3c", width: 1, dash: "dot"}}],
      // Inside the plot, at the top left of its line: above the plot is the legend's.
      annotations: [{x: unixDate(now), yref: "paper", y: 1, text: "now", showarrow: false,
                     font: {size: 10, color: "#c93c3c"}, xanchor: "right", yanchor: "top",
                     bgcolor: "rgba(255,255,255,0.8)"}],
      legend: {...PLOT_LAYOUT.legend, y: 1.02, yanchor: "bottom"},  // above the plot, whole
      margin: {...PLOT_LAYOUT.margin, t: 30},
    }), PLOT_CONFIG);
  }

  // --- latency ---------------------------------------------------------------------------------
  function renderLatency() {
    const cutoff = Date.now() / 1000 - LATENCY_WINDOW_S;
    state.latency = state.latency.filter((p) => p.t >= cutoff);
    const classes = [...new Set(state.latency.map((p) => p.cls))].sort();
    const traces = [];
    const body = $("latency-table").querySelector("tbody");
    const fresh = document.createDocumentFragment();
    classes.forEach((cls, i) => {
      const pts = state.latency.filter((p) => p.cls === cls);
      const color = CLASS_COLORS[i % CLASS_COLORS.length];
      traces.push({type: "scatter", mode: "markers", name: `${cls} TTFT`, x: pts.map((p) => unixDate(p.t)),
                   y: pts.map((p) => p.ttft), marker: {color, size: 5},
                   hovertext: pts.map((p) => fmt.seconds(p.ttft)), hovertemplate: "%{hovertext}"});
      traces.push({type: "scatter", mode: "markers", name: `${cls} end-to-end`, x: pts.map((p) => unixDate(p.t)),
                   y: pts.map((p) => p.e2e), marker: {color, size: 6, symbol: "diamond-open"},
                   hovertext: pts.map((p) => fmt.seconds(p.e2e)), hovertemplate: "%{hovertext}"});
      const ttft = pts.map((p) => p.ttft), e2e = pts.map((p) => p.e2e);
      const tr = el("tr", {"data-class": cls});
      tr.append(cell(cls), cell(fmt.int(pts.length), "num"),
                cell(fmt.seconds(quantile(ttft, 0.5)), "num"), cell(fmt.seconds(quantile(ttft, 0.99)), "num"),
                cell(fmt.seconds(quantile(e2e, 0.5)), "num"), cell(fmt.seconds(quantile(e2e, 0.99)), "num"));
      fresh.append(tr);
    });
    body.replaceChildren(fresh);
    $("latency-empty").hidden = classes.length > 0;
    $("latency-table").hidden = classes.length === 0;
    const now = Date.now() / 1000;
    const first = state.latency.length ? state.latency[0].t : now;
    const span = Math.min(LATENCY_WINDOW_S, Math.max(300, now - first + 30));
    Plotly.react("chart-latency", traces, layout({
      xaxis: {range: [unixDate(now - span), unixDate(now + 5)]},
      yaxis: {title: {text: "seconds", standoff: 4}}, hovermode: "closest",
    }), PLOT_CONFIG);
  }

  // --- the autobidder --------------------------------------------------------------------------
  function renderMu() {
    if (!$("chart-mu")) return;
    $("mu-empty").hidden = state.mu.length > 0;
    const a = initial.autobidder;
    const traces = [{
      type: "scatter", mode: "lines", name: "μ", line: {color: "#a05bd6", width: 2, shape: "hv"},
      x: state.mu.map((s) => unixDate(s[0])), y: state.mu.map((s) => s[1]), hovertext: state.mu.map((s) => `μ = ${fmt.figure(s[1])}`), hovertemplate: "%{hovertext}",
    }];
    // The spend path: what its budget had paid in this window at each step, against the even
    // pace (0 at the window's start, the whole budget at its end).
    const path = a.start === null ? [] : state.mu.filter((s) => s[0] >= a.start);
    if (path.length) {
      const pace = path.map((s) => Number(a.budget) * (s[0] - a.start) / (a.end - a.start));
      traces.push({
        type: "scatter", mode: "lines", name: "spent $", yaxis: "y2", line: {color: "#5b8cff", width: 2, shape: "hv"},
        x: path.map((s) => unixDate(s[0])), y: path.map((s) => Number(s[2])), hovertext: path.map((s) => `spent ${fmt.dollars(s[2])}`), hovertemplate: "%{hovertext}",
      }, {
        type: "scatter", mode: "lines", name: "even pace $", yaxis: "y2", line: {color: "#9aa3b5", width: 1.5, dash: "dash"},
        x: path.map((s) => unixDate(s[0])), y: pace, hovertext: pace.map((v) => `even pace ${fmt.dollars(v)}`), hovertemplate: "%{hovertext}",
      });
    }
    $("mu-note").textContent = a.budget === null ? "" : `μ, and the spend of its ${fmt.dollars(a.budget)} a ${a.period} against an even pace`;
    Plotly.react("chart-mu", traces, layout({
      yaxis: {title: {text: "μ", standoff: 4}},
      yaxis2: {title: {text: "$", standoff: 4}, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false},
      showlegend: path.length > 0,
    }), PLOT_CONFIG);
  }

  // --- requests --------------------------------------------------------------------------------
  function renderRequests(changed) {
    const rows = [...state.requests.values()].sort((a, b) => b.at - a.at).slice(0, REQUESTS_SHOWN);
    state.requests = new Map(rows.map((r) => [r.request_id, r]));
    const fresh = document.createDocumentFragment();
    for (const r of rows) {
      const tr = el("tr", {"data-request": r.request_id, class: changed && changed.has(r.request_id) ? "changed" : ""});
      tr.append(cell(fmt.time(r.at)), cell(r.request_class));
      const bid = cell(fmt.rate(r.bid), "num");
      if (r.bid_source !== "explicit") bid.append(el("span", {class: "muted small"}, ` ${r.bid_source}`));
      if (r.effective_bid === 0 && Number(r.bid) > 0) bid.title = "under the reserve: no priority";
      tr.append(bid);
      tr.append(cell(fmt.rate(r.block_bid_mean), "num"), cell(fmt.density(r.block_density), "num"));
      // Its place in line when it joined the queue (the first round that ordered it), 1 first.
      const rank = cell(r.rank === null ? "—" : `#${fmt.int(r.rank)} of ${fmt.int(r.queue_len)}`, "num");
      if (r.rank !== null) {
        rank.title = `${fmt.int(r.ahead)} waiting ahead of it when it joined the queue` +
          (r.engine ? ` of replica ${r.engine}` : "");
      }
      tr.append(rank);
      tr.append(cell(fmt.seconds(r.time_saved_s), "num"));
      tr.append(cell(fmt.dollars(r.priority_charge), "num"), cell(fmt.dollars(r.token_charge), "num"));
      tr.append(cell(fmt.seconds(r.ttft_s), "num"), cell(fmt.seconds(r.e2e_s), "num"));
      // "queued" means sent to the engine and not finished: admitted (charged) or still waiting.
      const shown = r.status === "queued" ? (r.priority_charge === null ? "waiting" : "running") : r.status;
      const status = el("td");
      status.append(el("span", {class: `tag tag-${shown}`}, shown));
      tr.append(status);
      fresh.append(tr);
    }
    $("requests").querySelector("tbody").replaceChildren(fresh);
    $("requests-empty").hidden = rows.length > 0;
    $("requests").hidden = rows.length === 0;
  }

  // --- what a bid buys: each market's bid -> time to first token curve -----------------------------
  // Polled from the dashboard's quotes URL (the same groups of recent bids GET /v1/quotes reads).
  function renderQuotes(markets) {
    const box = $("quote-curves");
    box.dataset.markets = String(markets.length);
    if (!markets.length) {
      box.replaceChildren(el("p", {class: "empty"}, "No active market."));
      return;
    }
    box.querySelector(".empty")?.remove();
    for (const m of markets) {
      const id = `quote-${m.market}`;
      let part = box.querySelector(`[data-market="${CSS.escape(m.market)}"]`);
      if (!part) {
        part = el("div", {class: "quote-curve", "data-market": m.market});
        part.append(el("h3", {class: "small"}, m.model), el("p", {class: "small muted quote-target"}),
                    el("div", {class: "chart chart-small", id}));
        box.append(part);
      }
      part.dataset.groups = String(m.groups.length);
      const t = m.target;
      const within = `a first token within ${fmt.seconds(t.ttft_s)} ${fmt.pct(t.probability)} of the time`;
      // Why there is no quote is the server's sentence (GET /v1/quotes' reason), as it is.
      part.querySelector(".quote-target").textContent = m.reason
        ? `${m.reason[0].toUpperCase()}${m.reason.slice(1)}.`
        : `Bid ${fmt.rate(t.bid)} for ${within} · from ${fmt.int(m.based_on.requests)} requests`;
      const xs = m.groups.map((g) => Number(g.median_bid));
      const hover = (key) => m.groups.map((g) =>
        `bids ${fmt.rate(g.bids_from)} to ${fmt.rate(g.bids_to)} (${fmt.int(g.requests)} requests): ${fmt.seconds(g[key])}`);
      const traces = [
        {type: "scatter", mode: "lines+markers", name: "TTFT p50", x: xs, y: m.groups.map((g) => g.ttft_p50_s),
         line: {color: "#5b8cff", width: 2}, hovertext: hover("ttft_p50_s"), hovertemplate: "%{hovertext}<extra></extra>"},
        {type: "scatter", mode: "lines+markers", name: "TTFT p90", x: xs, y: m.groups.map((g) => g.ttft_p90_s),
         line: {color: "#e08a2e", width: 2, dash: "dash"}, hovertext: hover("ttft_p90_s"), hovertemplate: "%{hovertext}<extra></extra>"},
      ];
      if (t.bid !== null) {
        traces.push({type: "scatter", mode: "markers", name: "priority quote", x: [Number(t.bid)], y: [t.ttft_s],
                     marker: {symbol: "star", size: 13, color: "#c93c3c"},
                     hovertext: [`${fmt.rate(t.bid)}: ${within}`], hovertemplate: "%{hovertext}<extra></extra>"});
      }
      const chart = $(id);
      chart.hidden = !m.groups.length;  // the line above says why there is no curve
      if (chart.hidden) continue;
      // Bids span orders of magnitude: a log axis, unless a group bid 0 (flex, or under the reserve).
      const positive = xs.every((x) => x > 0) && (t.bid === null || Number(t.bid) > 0);
      Plotly.react(id, traces, layout({
        xaxis: positive ? {type: "log", dtick: "D2", title: {text: "bid $/s", standoff: 4}}
          : {type: "linear", title: {text: "bid $/s", standoff: 4}},
        yaxis: {title: {text: "TTFT s", standoff: 4}}, hovermode: "closest",
      }), PLOT_CONFIG);
    }
    for (const part of box.querySelectorAll(".quote-curve")) {
      if (!markets.some((m) => m.market === part.dataset.market)) part.remove();
    }
  }

  async function pollQuotes() {
    try {
      const response = await fetch(initial.quotes.url, {headers: {Accept: "application/json"}});
      if (response.ok) renderQuotes((await response.json()).markets);
    } catch (err) {
      console.error("quotes: not refreshed", err);  // the last curve stays on screen
    }
  }

  // --- spend ticks -----------------------------------------------------------------------------
  function spendTick(t) {
    // Ticks come from two publishers and may overtake each other: an older one still brings
    // its requests, but not its (older) totals.
    if (t.at >= state.tick.at) {
      state.tick = t;
      const b = t.budget;
      if (b && b.resets_at && Math.abs(b.window_start - state.pacing.start) < 1) {
        state.pacing.points.push([t.at, b.spent]);
      } else if (b && b.resets_at) { // a new window began: start its curve again
        state.pacing = {period: b.period, start: b.window_start, end: b.resets_at, limit: b.limit,
                        points: [[t.at, b.spent]]};
      } else if (t.at < state.pacing.end) { // no budget that resets: this month's spend
        state.pacing.points.push([t.at, t.spent_window]);
      }
      state.dirty.pacing = true;
      renderSpend();
    }
    const changed = new Set();
    for (const r of t.requests) {
      state.requests.set(r.request_id, r);
      changed.add(r.request_id);
      if (r.ttft_s !== null && !state.latencySeen.has(r.request_id)) {
        state.latencySeen.add(r.request_id);
        state.latency.push({id: r.request_id, t: t.at, cls: r.request_class, ttft: r.ttft_s, e2e: r.e2e_s});
        state.dirty.latency = true;
      }
    }
    if (t.autobidder && (!state.mu.length || t.autobidder.at > state.mu[state.mu.length - 1][0])) {
      state.mu.push([t.autobidder.at, t.autobidder.mu, t.autobidder.spent]);
      state.dirty.mu = true;
    }
    if (changed.size) renderRequests(changed);
  }

  function redraw() {
    if (state.dirty.pacing) { state.dirty.pacing = false; renderPacing(); }
    if (state.dirty.latency) { state.dirty.latency = false; renderLatency(); }
    if (state.dirty.mu) { state.dirty.mu = false; renderMu(); }
  }

  renderSpend();
  renderRequests();
  redraw();
  renderQuotes(initial.quotes.markets);
  setInterval(() => { renderReset(); redraw(); }, 1000);
  setInterval(pollQuotes, initial.quotes.poll_s * 1000);

  window.live = new LiveSocket(initial.socket, (message) => {
    if (message.kind === "spend.tick") spendTick(message);
  }, $("live-state"));
})();
