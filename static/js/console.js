/* The operator console: the live order book (snapshot, then keyed diffs), engine status,
 * round results (revenue, welfare, the reserve the engine applies) and tenants' spend.
 * Payload shapes: market/payloads.py. */
"use strict";

(function () {
  const initial = JSON.parse(document.getElementById("initial").textContent);
  const $ = (id) => document.getElementById(id);
  const ENGINE_HISTORY_S = 600;

  const state = {
    version: 0,
    rows: new Map(),
    meta: null,
    bookAt: null,
    revenue: initial.revenue.map((m) => ({...m})),
    engine: initial.engine_chart.map(([t, queue, tps]) => ({t, queue, tps})),
    tenants: new Map(initial.tenants.map((t) => [t.tenant, t])),
    revenueDirty: true,
  };

  // --- the order book ---------------------------------------------------------------------
  function bookSet(snapshot) {
    state.version = snapshot.version;
    state.rows = new Map(snapshot.rows.map((r) => [r.key, r]));
    state.meta = snapshot;
    state.bookAt = Date.now();
    renderBook(new Set());
  }

  function bookDiff(diff, socket) {
    if (diff.version <= state.version) return; // old news (a resync already covered it)
    if (diff.base !== state.version) {
      socket.send({type: "book.resync"});
      return;
    }
    for (const key of diff.removed) state.rows.delete(key);
    const changed = new Set();
    for (const row of diff.changed) {
      state.rows.set(row.key, row);
      changed.add(row.key);
    }
    state.version = diff.version;
    state.meta = diff;
    state.bookAt = Date.now();
    renderBook(changed);
  }

  /** The rows in tree order: each subtree right under its parent, siblings by position. */
  function bookOrder(rows) {
    const byPosition = (a, b) => a.position - b.position || b.requests - a.requests;
    const keys = new Set(rows.map((r) => r.key));
    const children = new Map();
    const top = [];
    for (const r of rows) {
      if (r.parent && keys.has(r.parent)) {
        if (!children.has(r.parent)) children.set(r.parent, []);
        children.get(r.parent).push(r);
      } else {
        top.push(r);
      }
    }
    const ordered = [];
    const visit = (r) => {
      ordered.push(r);
      (children.get(r.key) || []).sort(byPosition).forEach(visit);
    };
    top.sort(byPosition).forEach(visit);
    return ordered;
  }

  /** A subtree's label: its prefix's start; below another subtree, where it leaves it. */
  function subtreeLabel(r) {
    const label = el("td", {class: "label"});
    if (r.parent && r.branch !== undefined) {
      label.title = `prefix: ${r.label} …\nleaves its parent at: ${r.branch}`;
      label.append(el("span", {class: "branch-from"}, "… "));
      label.append(el("span", {class: "prefix"}, r.branch || "(empty)"));
    } else {
      label.title = r.label;
      label.append(el("span", {class: "prefix"}, r.label || "(empty prefix)"));
    }
    if (r.replicas) {  // a market of replicas: who holds how many of the subtree's requests
      const held = el("span", {class: "replicas-held muted small"});
      held.append(...Object.entries(r.replicas).sort((a, b) => a[0].localeCompare(b[0]))
        .map(([engine, n]) => el("span", {class: "held", "data-engine": engine}, `${engine}: ${fmt.int(n)}`)));
      label.append(held);
    }
    return label;
  }

  /** Whose requests wait in a subtree: tenant and count, the most first. */
  function tenantsCell(r) {
    const td = el("td", {class: "tenants"});
    const entries = Object.entries(r.tenants || {})
      .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
    for (const [name, n] of entries) {
      const span = el("span", {class: "tenant", "data-tenant": name});
      span.append(document.createTextNode(`${name || "untagged"} `), el("b", {}, fmt.int(n)));
      td.append(span);
    }
    if (!entries.length) td.textContent = "—";
    return td;
  }

  function renderBook(changed) {
    const table = $("book");
    const body = table.querySelector("tbody");
    const rows = bookOrder([...state.rows.values()]);
    const maxMean = Math.max(1e-12, ...rows.map((r) => r.bid_mean));
    const fresh = document.createDocumentFragment();
    for (const r of rows) {
      const tr = el("tr", {"data-key": r.key, class: `depth-${r.depth}${changed.has(r.key) ? " changed" : ""}`});
      tr.append(cell(`#${fmt.int(r.position + 1)}`, "num"));
      tr.append(subtreeLabel(r));
      tr.append(tenantsCell(r));
      tr.append(cell(fmt.int(r.requests), "num"));
      tr.append(cell(fmt.rate(r.bid_sum), "num"));
      tr.append(cell(r.credit_sum ? fmt.rate(r.credit_sum) : "—", "num credit"));
      const mean = cell(fmt.rate(r.bid_mean), "num");
      const bar = el("span", {class: "bar"});
      const fill = el("span");
      fill.style.width = `${Math.round((100 * r.bid_mean) / maxMean)}%`;
      bar.append(fill);
      mean.append(bar);
      tr.append(mean);
      tr.append(cell(fmt.density(r.density), "num"));
      tr.append(cell(`${fmt.int(r.prefix_tokens)} (${fmt.int(r.cached_tokens)})`, "num"));
      fresh.append(tr);
    }
    body.replaceChildren(fresh);
    table.dataset.version = String(state.version);
    $("book-empty").hidden = rows.length > 0;
    table.hidden = rows.length === 0;
    renderBookMeta();
  }

  function renderBookMeta() {
    const m = state.meta;
    if (!m) return;
    const ago = state.bookAt ? ((Date.now() - state.bookAt) / 1000).toFixed(0) : "?";
    // Replicas report in turn: each one's latest round, never one round that jumps between them.
    const rounds = Object.entries(m.rounds || {}).sort((a, b) => a[0].localeCompare(b[0]));
    const at = rounds.length > 1 ? `rounds ${rounds.map(([e, n]) => `${e} ${n}`).join(" · ")}`
      : `round ${rounds.length ? rounds[0][1] : m.round_id.split(":").pop()}`;
    $("book-meta").textContent =
      `${fmt.int(m.waiting)} waiting at ${at} · ${m.policy} · updated ${ago} s ago · v${state.version}`;
  }

  // --- round results: revenue, welfare, what the engine applies ------------------------------
  function minuteBucket(tUnix) {
    const t = Math.floor(tUnix / 60) * 60;
    let last = state.revenue[state.revenue.length - 1];
    while (!last || last.t < t) {
      const next = last ? last.t + 60 : t;
      state.revenue.push({t: next, priority: 0, tokens: 0, welfare: 0, requests: 0});
      last = state.revenue[state.revenue.length - 1];
      if (state.revenue.length > 60) state.revenue.shift();
    }
    return state.revenue.find((m) => m.t === t) || last;
  }

  // The change logs follow the automatic reserve: when a round reports a reserve the log's newest
  // entry does not have, the logs are read again from this page (one fetch at a time, at most one
  // every 5 s), so its "auto" entries appear without a reload.
  let logsFetching = false;
  let logsFetchedAt = 0;
  async function logsFollow(reserve) {
    if (!(initial.auto_reserve && initial.auto_reserve.on)) return;
    const newest = document.querySelector("#reserve-audit tbody tr td[data-new]");
    if (newest && Math.abs(Number(newest.dataset.new) - reserve) < 1e-12) return;
    if (logsFetching || Date.now() - logsFetchedAt < 5000) return;
    logsFetching = true;
    logsFetchedAt = Date.now();
    try {
      const reply = await fetch(location.pathname, {headers: {Accept: "text/html"}, credentials: "same-origin"});
      if (!reply.ok) return;
      const page = new DOMParser().parseFromString(await reply.text(), "text/html");
      for (const id of ["reserve-log", "control-log"]) {
        const fresh = page.getElementById(id);
        if (fresh && $(id)) $(id).innerHTML = fresh.innerHTML;
      }
    } catch (err) {
      // The next round asks again.
    } finally {
      logsFetching = false;
    }
  }

  /** The reserve card: by the one rule (three significant digits, as the cards beside it),
   * every digit in its title. */
  function reserveCard() {
    $("kpi-reserve").textContent = fmt.rate(initial.reserve);
    $("kpi-reserve").title = `${numbers.exact(initial.reserve)} $/s`;
  }

  function roundResult(r) {
    const bucket = minuteBucket(Date.now() / 1000);
    bucket.priority += r.revenue;
    bucket.welfare += r.welfare;
    bucket.requests += r.admitted;
    state.revenueDirty = true;
    if (initial.auto_reserve && initial.auto_reserve.on) {
      // The automatic reserve moves it between page loads: what the engine applies is the news.
      initial.reserve = String(r.reserve);
      reserveCard();
    }
    logsFollow(r.reserve);
    const reserveNote = $("kpi-engine-reserve");
    reserveNote.dataset.reserve = String(r.reserve);
    const reserveApplied = Math.abs(r.reserve - Number(initial.reserve)) < 1e-12;
    // Reserves are settings an operator typed: shown with all their digits (numbers.exact).
    reserveNote.textContent = reserveApplied ? "in effect" : `engine at ${numbers.exact(r.reserve)} $/s`;
    reserveNote.title = reserveApplied ? "the engine's last round used this reserve"
      : "the engine's last round used another reserve: the change is on its way";
    reserveNote.classList.toggle("pending", !reserveApplied);
    const policyNote = $("kpi-engine-policy");
    policyNote.dataset.policy = r.policy;
    policyNote.textContent = r.policy === initial.policy ? "in effect" : `engine at ${r.policy}`;
    policyNote.classList.toggle("pending", r.policy !== initial.policy);
  }

  function renderRevenue() {
    if (!state.revenueDirty) return;
    state.revenueDirty = false;
    // From the first minute with activity (at least the last 15 minutes), not an hour of zeros.
    const first = state.revenue.findIndex((m) => m.priority || m.tokens || m.welfare);
    const from = first < 0 ? state.revenue.length - 15 : Math.min(first - 1, state.revenue.length - 15);
    const shown = state.revenue.slice(Math.max(0, from));
    const xs = shown.map((m) => unixDate(m.t));
    const last = state.revenue[state.revenue.length - 1];
    $("kpi-revenue").textContent = last ? fmt.dollars(last.priority) : "—";
    Plotly.react("chart-revenue", [
      {type: "bar", name: "priority charges", x: xs, y: shown.map((m) => m.priority),
       marker: {color: "#5b8cff"}, hovertext: shown.map((m) => fmt.dollars(m.priority)), hovertemplate: "%{hovertext}"},
      {type: "bar", name: "token charges", x: xs, y: shown.map((m) => m.tokens),
       marker: {color: "#b9ccf7"}, hovertext: shown.map((m) => fmt.dollars(m.tokens)), hovertemplate: "%{hovertext}"},
      {type: "scatter", mode: "lines+markers", name: "waiting cost (−welfare)", x: xs,
       y: shown.map((m) => -m.welfare), line: {color: "#e08a2e", width: 2}, marker: {size: 4},
       hovertext: shown.map((m) => fmt.dollars(-m.welfare)), hovertemplate: "%{hovertext}"},
    ], layout({
      barmode: "stack",
      yaxis: {...ruledTicks([...shown.map((m) => m.priority + m.tokens), ...shown.map((m) => -m.welfare)]),
              title: {text: "$ per minute", standoff: 4}},
    }), PLOT_CONFIG);
  }

  // --- engine status --------------------------------------------------------------------------
  function engineStatus(s) {
    const down = $("engine-down");
    if (!s.up) {
      down.hidden = false;
      down.textContent = `The engine does not answer its /metrics: ${s.error}`;
    } else if (s.error) {
      down.hidden = false;  // a market of replicas, some of them down
      down.textContent = `Serving on the replicas left; ${s.error}`;
    } else {
      down.hidden = true;
    }
    $("kpi-queue").textContent = fmt.int(s.queue);
    $("kpi-running").textContent = fmt.int(s.running);
    $("kpi-cache").textContent = fmt.pct(s.cache_hit_rate);
    $("kpi-tps").textContent = s.tokens_per_second === null ? "—" : fmt.int(s.tokens_per_second);
    const ttft = $("kpi-ttft");
    if (s.ttft_p50_s === null) ttft.textContent = "—";  // each figure kept whole when it wraps:
    else ttft.replaceChildren(el("span", {class: "nowrap"}, fmt.seconds(s.ttft_p50_s)), " / ",
                              el("span", {class: "nowrap"}, fmt.seconds(s.ttft_p99_s)));
    $("kpi-ttft-window").textContent = s.window_s ? `last ${fmt.duration(s.window_s)}`
      : "since the engine started";
    renderReplicas(s.replicas || []);
    renderAlerts(s);
    const latest = state.engine[state.engine.length - 1];
    if (s.up && (!latest || s.at > latest.t)) {
      state.engine.push({t: s.at, queue: s.queue, tps: s.tokens_per_second});
      while (state.engine.length && state.engine[0].t < s.at - ENGINE_HISTORY_S) state.engine.shift();
      renderEngine();
    }
  }

  /** The operator's thresholds (initial.alerts) against the live status: a banner naming each
   * figure above its threshold, and its KPI marked. The same rule as the Prometheus alerts
   * (deploy/prometheus/alerts.yml): strictly above. */
  function renderAlerts(s) {
    const limits = initial.alerts || {};
    const crossed = [];
    const queueHigh = limits.queue !== null && limits.queue !== undefined && s.queue !== null
      && s.queue > limits.queue;
    if (queueHigh) {
      crossed.push(`Queue: ${fmt.int(s.queue)} requests waiting, above the threshold of ` +
                   `${fmt.int(limits.queue)}.`);
    }
    const ttftHigh = limits.ttft_p99_s !== null && limits.ttft_p99_s !== undefined
      && s.ttft_p99_s !== null && s.ttft_p99_s > limits.ttft_p99_s;
    if (ttftHigh) {
      crossed.push(`TTFT p99: ${fmt.seconds(s.ttft_p99_s)}, above the threshold of ` +
                   `${fmt.seconds(limits.ttft_p99_s)}.`);
    }
    $("kpi-queue").parentElement.classList.toggle("alerting", queueHigh);
    $("kpi-ttft").parentElement.classList.toggle("alerting", ttftHigh);
    const banner = $("alerts");
    banner.hidden = crossed.length === 0;
    banner.dataset.crossed = [queueHigh ? "queue" : "", ttftHigh ? "ttft_p99" : ""]
      .filter(Boolean).join(" ");
    const list = el("ul");
    for (const line of crossed) list.append(el("li", {}, line));
    banner.replaceChildren(document.createTextNode(
      `Alert: ${crossed.length} threshold${crossed.length === 1 ? "" : "s"} crossed`), list);
  }

  function renderReplicas(replicas) {
    const card = $("replicas");
    card.hidden = replicas.length === 0;
    const body = $("replicas-table").querySelector("tbody");
    body.replaceChildren(...replicas.map((r) => {
      const row = document.createElement("tr");
      row.dataset.engine = r.engine_id;
      const cells = [
        r.engine_id, r.url, r.up ? "up" : `down: ${r.error}`, fmt.int(r.queue),
        fmt.int(r.running), fmt.pct(r.cache_hit_rate),
        r.tokens_per_second === null ? "—" : fmt.int(r.tokens_per_second),
        r.ttft_p50_s === null ? "—" : fmt.seconds(r.ttft_p50_s),
      ];
      cells.forEach((text, i) => {
        const cell = document.createElement("td");
        cell.textContent = text;
        if (i >= 3) cell.className = "num";
        if (i === 2 && !r.up) cell.className = "down";
        row.appendChild(cell);
      });
      return row;
    }));
  }

  function renderEngine() {
    const xs = state.engine.map((p) => unixDate(p.t));
    const now = Date.now() / 1000;
    const span = state.engine.length ? Math.max(120, now - state.engine[0].t) : 120;
    Plotly.react("chart-engine", [
      {type: "scatter", mode: "lines", name: "queue (requests)", x: xs,
       y: state.engine.map((p) => p.queue), line: {color: "#e08a2e", width: 2, shape: "hv"}},
      {type: "scatter", mode: "lines", name: "output tokens/s", x: xs, yaxis: "y2",
       y: state.engine.map((p) => p.tps), line: {color: "#5b8cff", width: 2}},
    ], layout({
      xaxis: {range: [unixDate(now - span), unixDate(now)]},
      yaxis: {...ruledTicks(state.engine.map((p) => p.queue)), title: {text: "requests", standoff: 4}},
      yaxis2: {overlaying: "y", side: "right", showgrid: false, zeroline: false, rangemode: "tozero",
               ...ruledTicks(state.engine.map((p) => p.tps)), title: {text: "tokens/s", standoff: 4}},
      margin: {l: 56, r: 60, t: 8, b: 32},
    }), PLOT_CONFIG);
  }

  // --- tenants --------------------------------------------------------------------------------
  /** A tenant's page: the table's URL pattern (``data-<which>-url``) with its slug put in. */
  function tenantUrl(which, slug) {
    return $("tenants").dataset[`${which}Url`].replace("__tenant__", encodeURIComponent(slug));
  }

  function renderTenants() {
    const body = $("tenants").querySelector("tbody");
    const rows = [...state.tenants.values()].sort((a, b) => a.name.localeCompare(b.name));
    const fresh = document.createDocumentFragment();
    for (const t of rows) {
      const b = t.budget;
      const tr = el("tr", {"data-tenant": t.tenant});
      const name = el("td");
      name.append(el("a", {href: tenantUrl("dashboard", t.tenant)}, t.name));
      tr.append(name);
      tr.append(cell(b ? `per ${b.period}` : "none"));
      tr.append(cell(b ? fmt.dollars(b.spent) : "—", "num"));
      tr.append(cell(b ? fmt.dollars(b.limit) : "—", "num"));
      tr.append(cell(b ? fmt.dollars(b.held) : "—", "num"));
      tr.append(cell(b ? fmt.dollars(b.remaining) : "—", "num"));
      const used = el("td");
      if (b && Number(b.limit) > 0) {
        const share = Math.min(1, Number(b.spent) / Number(b.limit));
        const wrap = el("div", {class: "used"});
        const meter = el("div", {class: "meter"});
        const fill = el("span", {class: meterClass(share)});
        fill.style.width = `${(share * 100).toFixed(1)}%`;
        meter.append(fill);
        wrap.append(meter, el("span", {class: "small muted"}, fmt.pct(share)));
        used.append(wrap);
      }
      tr.append(used);
      tr.append(cell(fmt.dollars(t.spent_today), "num"));
      tr.append(cell(b && b.resets_at ? `in ${fmt.duration(Math.max(0, b.resets_at - Date.now() / 1000))}` : "never"));
      const pages = el("td", {class: "nowrap"});
      pages.append(
        el("a", {href: tenantUrl("dashboard", t.tenant)}, "Dashboard"), " · ",
        el("a", {href: tenantUrl("invoices", t.tenant)}, "Invoices"),
      );
      tr.append(pages);
      fresh.append(tr);
    }
    body.replaceChildren(fresh);
    $("tenants-empty").hidden = rows.length > 0;
  }

  // --- controls: what a reserve would do before it is applied; what a policy does ------------
  let impactAsked = 0;
  async function reserveImpact() {
    const form = $("reserve-form");
    const input = $("reserve-input");
    const out = $("reserve-impact");
    const asked = ++impactAsked;
    const value = input.value.trim();
    if (!value || !input.validity.valid || Number(value) === Number(initial.reserve)) {
      out.hidden = true;
      return;
    }
    let answer;
    try {
      const reply = await fetch(`${form.dataset.impactUrl}?reserve=${encodeURIComponent(value)}`,
                                {headers: {Accept: "application/json"}});
      if (!reply.ok) { out.hidden = true; return; }
      answer = await reply.json();
    } catch (error) {
      out.hidden = true;
      return;
    }
    if (asked !== impactAsked) return;  // a newer value was typed meanwhile
    const shown = `${numbers.exact(answer.reserve)} $/s`;  // as typed
    const parts = [];
    const i = answer.impact;
    if (answer.above_ceiling) {
      parts.push(`Above the ceiling (${numbers.exact(answer.ceiling)} $/s): it would be refused.`);
    } else if (!i) {
      parts.push("No book from the engines yet: nothing to count.");
    } else if (!i.waiting) {
      parts.push("The book is empty now: no waiting request is affected.");
    } else {
      const about = i.exact ? "" : "about ";
      parts.push(`In the book now, ${about}${i.below} of ${i.waiting} waiting bids are below ` +
                 `${shown} (${i.below_now} below the current reserve)`);
      if (i.lose_priority) parts.push(`: ${i.lose_priority} would lose their priority.`);
      else if (i.gain_priority) parts.push(`: ${i.gain_priority} would gain priority.`);
      else parts.push(".");
    }
    if (answer.confirm && !answer.above_ceiling) parts.push(" Far from the current reserve: you will be asked to confirm.");
    out.textContent = parts.join("");
    out.className = `impact${answer.above_ceiling ? " bad" : answer.confirm || (i && i.lose_priority) ? " warn" : ""}`;
    out.hidden = false;
  }

  let impactTimer = null;
  $("reserve-input").addEventListener("input", () => {
    clearTimeout(impactTimer);
    impactTimer = setTimeout(reserveImpact, 250);
  });
  $("policy-select").addEventListener("change", (event) => {
    const option = event.target.selectedOptions[0];
    $("policy-description").textContent = option ? option.dataset.description : "";
  });

  // --- reserve what-if: the recorded queues cleared again at other reserves (market/live/whatif.py)
  const WHATIF_POLL_MS = 30_000;
  const WHATIF_CAVEAT = "Bidders may respond to a new reserve:<br>this is what the recorded queues<br>would have paid, not a forecast.";

  async function whatIf() {
    let answer;
    try {
      const reply = await fetch($("whatif").dataset.url, {headers: {Accept: "application/json"}});
      if (!reply.ok) return;
      answer = await reply.json();
    } catch (error) {
      return;
    }
    renderWhatIf(answer);
  }

  function renderWhatIf(w) {
    const chart = $("chart-whatif");
    const shown = w.points.length > 0;
    $("whatif-empty").hidden = shown;
    chart.hidden = !shown;
    if (!shown) return;
    const used = w.sampled - w.skipped;
    $("whatif-meta").textContent =
      `${fmt.int(used)} of ${fmt.int(w.rounds)} recorded round${w.rounds === 1 ? "" : "s"}`;
    chart.dataset.current = String(w.current);
    const xs = w.points.map((p) => p.reserve);
    const line = (name, y, axis, color, text) => ({
      type: "scatter", mode: "lines+markers", name, x: xs, y, yaxis: axis,
      line: {color, width: 2, shape: "hv"}, marker: {size: 4},
      hovertext: w.points.map((p, i) => `${fmt.rate(p.reserve)}: ${text[i]}`), hovertemplate: "%{hovertext}<extra></extra>",
    });
    const traces = [
      line("revenue", w.points.map((p) => p.revenue), "y", "#5b8cff", w.points.map((p) => fmt.dollars(p.revenue))),
      line("welfare", w.points.map((p) => p.welfare), "y2", "#e08a2e", w.points.map((p) => fmt.dollars(p.welfare))),
      line("keeping priority", w.points.map((p) => p.priority_share), "y3", "#3aa876",
           w.points.map((p) => fmt.pct(p.priority_share))),
    ];
    if (w.recorded !== null && w.recorded_at_current) {
      traces.push({type: "scatter", mode: "markers", name: "recorded", x: [w.current], y: [w.recorded], yaxis: "y",
                   marker: {symbol: "diamond-open", size: 11, color: "#1d2433", line: {width: 2}},
                   hovertext: [`recorded: ${fmt.dollars(w.recorded)}`], hovertemplate: "%{hovertext}<extra></extra>"});
    }
    const panel = (title, domain, extra) => ({
      domain, title: {text: title, standoff: 10}, gridcolor: "#edf0f4", zeroline: false, ...extra,
    });
    Plotly.react("chart-whatif", traces, layout({
      xaxis: {type: "linear", anchor: "y3", rangemode: "tozero", ...ruledTicks(xs),
              title: {text: "reserve, $/s", standoff: 4}},
      yaxis: panel("revenue, $", [0.7, 1], {rangemode: "tozero",
                   ...ruledTicks([...w.points.map((p) => p.revenue), w.recorded], {count: 3})}),
      yaxis2: panel("welfare, $", [0.36, 0.64], {rangemode: "normal",
                    ...ruledTicks(w.points.map((p) => p.welfare), {count: 3, zero: false})}),
      yaxis3: panel("keeping priority", [0, 0.3], {range: [0, 1.05],
                    ...ruledTicks([1], {count: 2, label: numbers.percent})}),
      shapes: [{type: "line", xref: "x", yref: "paper", x0: w.current, x1: w.current, y0: 0, y1: 1,
                line: {color: "#1d2433", width: 1.5, dash: "dash"}}],
      annotations: [
        {xref: "x", yref: "paper", x: w.current, y: 1, xanchor: "left", yanchor: "top", showarrow: false,
         text: `current ${fmt.rate(w.current)}`, font: {size: 10, color: "#1d2433"}, bgcolor: "rgba(255,255,255,0.6)"},
        {xref: "paper", yref: "paper", x: 0, y: -0.13, xanchor: "left", yanchor: "top", showarrow: false,
         align: "left", text: WHATIF_CAVEAT, font: {size: 10, color: "#8a4b0f"}},
      ],
      hovermode: "closest",
      showlegend: true,
      legend: {orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: {size: 10}},
      margin: {l: 62, r: 12, t: 28, b: 96},
    }), PLOT_CONFIG);
  }

  // --- wiring ---------------------------------------------------------------------------------
  const handlers = {
    "book.snapshot": (m) => bookSet(m),
    "book.diff": (m, socket) => bookDiff(m, socket),
    "round.result": (m) => roundResult(m),
    "engine.status": (m) => engineStatus(m),
    "tenant.spend": (m) => { state.tenants.set(m.tenant, m); renderTenants(); },
  };

  reserveCard();
  // A refused change: its field, beside the refusal, in the middle of the window and focused
  // (as its autofocus does without scripts). A refused reserve keeps what was typed, so the
  // operator sees what was refused, not the value in force.
  const refusedField = document.querySelector('#controls [aria-invalid="true"]');
  if (refusedField) {
    refusedField.scrollIntoView({block: "center"});
    refusedField.focus({preventScroll: true});
  }
  if ($("reserve-input").getAttribute("aria-invalid") !== "true") {
    $("reserve-input").value = numbers.exact(initial.reserve);
  }
  if (initial.book) bookSet(initial.book); else { $("book").hidden = true; }
  if (initial.engine) engineStatus(initial.engine);
  renderEngine();
  renderRevenue();
  renderTenants();
  setInterval(() => { renderBookMeta(); renderRevenue(); }, 1000);
  whatIf();
  setInterval(whatIf, WHATIF_POLL_MS);

  window.live = new LiveSocket(initial.socket, (message, socket) => {
    const handle = handlers[message.kind];
    if (handle) handle(message, socket);
  }, $("live-state"));
})();
