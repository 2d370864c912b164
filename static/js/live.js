/* Live pages: a websocket that reconnects by itself, and number formatting with units.
 *
 * LiveSocket(path, onMessage, stateElement) opens ws(s)://host/path, hands every JSON message to
 * onMessage, and when the socket drops shows "reconnecting…" in stateElement (the page keeps
 * showing its last state) and tries again after 0.5, 1, 2, 4 ... 15 s (with jitter).
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

const fmt = {
  /** Dollars: exact strings or numbers; small amounts keep their significant digits. */
  dollars(value) {
    if (value === null || value === undefined || value === "") return "—";
    const x = Number(value);
    if (!Number.isFinite(x)) return "—";
    const a = Math.abs(x);
    if (a === 0) return "0.00";
    if (a >= 100) return x.toLocaleString("en-US", {maximumFractionDigits: 2, minimumFractionDigits: 2});
    if (a >= 1) return x.toFixed(2);
    if (a >= 0.01) return x.toFixed(4);
    if (a >= 0.0001) return x.toFixed(6);
    return x.toPrecision(3);
  },
  /** A bid or reserve in $/s: up to 4 significant digits, no trailing zeros. */
  rate(value) {
    if (value === null || value === undefined || value === "") return "—";
    const x = Number(value);
    if (!Number.isFinite(x)) return "—";
    if (x === 0) return "0";
    if (Math.abs(x) >= 1000) return x.toLocaleString("en-US", {maximumFractionDigits: 2});
    const digits = Math.max(0, 3 - Math.floor(Math.log10(Math.abs(x))));
    return x.toFixed(Math.min(digits, 9)).replace(/\.?0+$/, "");
  },
  /** Bid density $/s per token, shown per 1,000 tokens. */
  density(value) {
    if (value === null || value === undefined) return "—";
    return fmt.rate(Number(value) * 1000);
  },
  seconds(value) {
    if (value === null || value === undefined || !Number.isFinite(Number(value))) return "—";
    const x = Number(value);
    if (x === 0) return "0";
    if (x < 0.01) return `${(x * 1000).toFixed(1)} ms`;
    if (x < 10) return x.toFixed(2);
    return x.toFixed(1);
  },
  int(value) {
    if (value === null || value === undefined) return "—";
    return Math.round(Number(value)).toLocaleString("en-US");
  },
  pct(value) {
    if (value === null || value === undefined) return "—";
    return `${(Number(value) * 100).toFixed(1)}%`;
  },
  /** A duration in seconds as "3 d 4 h", "2 h 5 m", "4 m 10 s". */
  duration(s) {
    if (s === null || s === undefined) return "—";
    s = Math.max(0, Math.floor(s));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60), sec = s % 60;
    if (d) return `${d} d ${h} h`;
    if (h) return `${h} h ${m} m`;
    if (m) return `${m} m ${sec} s`;
    return `${sec} s`;
  },
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

const PLOT_CONFIG = {displayModeBar: false, responsive: true};
const PLOT_LAYOUT = {
  margin: {l: 52, r: 16, t: 8, b: 32},
  font: {family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 11, color: "#5d6678"},
  paper_bgcolor: "rgba(0,0,0,0)",
  plot_bgcolor: "rgba(0,0,0,0)",
  xaxis: {gridcolor: "#edf0f4", zeroline: false, type: "date"},
  yaxis: {gridcolor: "#edf0f4", zeroline: false, rangemode: "tozero"},
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
