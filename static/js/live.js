/* Live pages: a websocket that reconnects by itself, and number formatting with units.
 *
 * LiveSocket(path, onMessage, stateElement) opens ws(s)://host/path, hands every JSON message to
 * onMessage, and when the socket drops shows "reconnecting…" in stateElement (the page keeps
 * showing its last state) and tries again after 0.5, 1, 2, 4 ... 15 s (with jitter).
 * Needs numbers.js loaded first (fmt below is its rule).
 */
"use strict";

class LiveSocket {
  constructor(path, onMessage, stateElement) {
    this.path = path;
    this.onMessage = onMessage;
    this.stateElement = stateElement;
    this.delay = 0;
    this.ws = null;
    this.connect();
  }

  setState(state, text) {
    if (!this.stateElement) return;
    this.stateElement.dataset.state = state;
    this.stateElement.textContent = text;
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}${this.path}`);
    this.ws = ws;
    ws.onopen = () => {
      this.delay = 0;
      this.setState("live", "live");
    };
    ws.onmessage = (event) => {
      try {
        this.onMessage(JSON.parse(event.data), this);
      } catch (err) {
        console.error("live: bad message", err);
      }
    };
    ws.onclose = () => {
      if (this.ws !== ws) return;
      this.delay = this.delay ? Math.min(this.delay * 2, 15000) : 500;
      const wait = this.delay * (0.8 + Math.random() * 0.4);
      this.setState("reconnecting", "reconnecting…");
      setTimeout(() => this.connect(), wait);
    };
  }

  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }
}

/** Figures for the live pages: numbers.js's rule (static/js/numbers.js), each with its unit. */
const fmt = {
  dollars: numbers.usd,  // "$0.00784", "$9.26"
  rate: numbers.usdPerS,  // "0.0126 $/s"
  /** Bid density, $/s per token, shown per 1,000 tokens. */
  density(value) {
    return value === null || value === undefined ? "—" : numbers.usdPerS(Number(value) * 1000);
  },
  seconds: numbers.duration,  // "84.7 ms", "2.1 s", "2 min 5 s"
  duration: numbers.duration,  // "28 d 9 h"
  int: numbers.count,
  pct: numbers.percent,
  figure: numbers.figure,
  time(unix) {
    if (!unix) return "—";
    return new Date(unix * 1000).toLocaleTimeString("en-GB", {hour12: false});
  },
  date(unix) {
    if (!unix) return "—";
    return new Date(unix * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC";
  },
};

/** A new element with attributes ("class" sets its className) and, if given, its text. */
function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  if (text !== undefined) node.textContent = text;
  return node;
}

function cell(text, cls) {
  return el("td", cls ? {class: cls} : {}, text);
}

/** The class of a budget meter filled to ``share`` (0..1): warn past 75%, bad past 90%. */
function meterClass(share) {
  return share > 0.9 ? "bad" : share > 0.75 ? "warn" : "";
}

/** A quantile of a list of numbers (q in 0..1), nearest rank; null when empty. */
function quantile(values, q) {
  const xs = values.filter((v) => v !== null && v !== undefined).sort((a, b) => a - b);
  if (!xs.length) return null;
  return xs[Math.min(xs.length - 1, Math.max(0, Math.ceil(q * xs.length) - 1))];
}

/** A value axis's ticks written by the one rule (numbers.js; by default ``numbers.figure``), not
 * by Plotly's own format, which mixes SI prefixes ("600µ") with plain decimals ("−0.0005"):
 * about ``count`` round values (1, 2 or 5 x a power of ten apart) across ``values`` (and 0,
 * unless ``zero`` is false). Spread into the axis: ``yaxis: {...ruledTicks(ys), title}``. */
function ruledTicks(values, {count = 5, label = numbers.figure, zero = true} = {}) {
  const xs = values.map(Number).filter(Number.isFinite);
  if (zero) xs.push(0);
  if (!xs.length) return {};
  let lo = Math.min(...xs), hi = Math.max(...xs);
  if (hi === lo) hi = lo + (Math.abs(lo) || 1);
  const rough = (hi - lo) / count;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 5, 10].map((k) => k * power).find((s) => s >= rough * (1 - 1e-9));
  const tickvals = [];
  for (let i = Math.floor(lo / step + 1e-9); i <= Math.ceil(hi / step - 1e-9); i++) {
    tickvals.push(Number((i * step).toPrecision(12)));  // 3 x 0.0002 is 0.0006, not ...0001
  }
  return {tickmode: "array", tickvals, ticktext: tickvals.map(label)};
}

const PLOT_CONFIG = {displayModeBar: false, responsive: true};
const PLOT_LAYOUT = {
  margin: {l: 52, r: 16, t: 8, b: 32},
  font: {family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 11, color: "#5d6678"},
  paper_bgcolor: "rgba(0,0,0,0)",
  plot_bgcolor: "rgba(0,0,0,0)",
  xaxis: {gridcolor: "#edf0f4", zeroline: false, type: "date"},
  // An axis left to Plotly writes plain decimals, thousands separated (no "600µ", no "1.2k").
  yaxis: {gridcolor: "#edf0f4", zeroline: false, rangemode: "tozero", exponentformat: "none",
          separatethousands: true},
  legend: {orientation: "h", x: 0, y: 1.12, font: {size: 11}},
  hovermode: "x unified",
};

function layout(extra) {
  const merged = {...PLOT_LAYOUT, ...extra};
  merged.xaxis = {...PLOT_LAYOUT.xaxis, ...(extra && extra.xaxis)};
  merged.yaxis = {...PLOT_LAYOUT.yaxis, ...(extra && extra.yaxis)};
  return merged;
}

function unixDate(t) { return new Date(t * 1000); }
