/* Figures for people: the browser's copy of accounts/figures.py, the one rule for numbers shown
 * (its docstring says the rule; docs/console.md too). Every figure carries its unit:
 *   usd(0.00784) "$0.00784", usd(9.2649) "$9.26"; usdPerS("0.01258") "0.0126 $/s";
 *   duration(0.0847) "84.7 ms", duration(2454360) "28 d 9 h"; figure, count, percent.
 * Values are read as exact decimals (a string as written, a number by String(x), the shortest
 * repr, as Python's repr) and rounded half up with BigInt arithmetic, so the text is the same
 * as the server's for the same value (tests/accounts/test_figures.py feeds both one table).
 * null, undefined, "" and what is not a finite number read "—".
 */
"use strict";

const numbers = (() => {
  const SIGNIFICANT = 3;
  const MONEY_PLACES_MAX = 9;
  const NONE = "—";
  const DECIMAL = /^([+-])?(\d+)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/;

  /** {neg, digits (BigInt), exp}: the value digits × 10^exp; null when not a finite number. */
  function parse(value) {
    if (value === null || value === undefined || value === "" || typeof value === "boolean") return null;
    const text = typeof value === "number" ? String(value) : String(value).trim();
    const m = DECIMAL.exec(text);
    if (!m) return null;
    const frac = m[3] || "";
    return {neg: m[1] === "-", digits: BigInt(m[2] + frac), exp: Number(m[4] || 0) - frac.length};
  }

  const isZero = (d) => d.digits === 0n;
  const abs = (d) => ({...d, neg: false});
  /** The exponent of the leading digit (Python's Decimal.adjusted()). */
  const adjusted = (d) => d.digits.toString().length - 1 + d.exp;
  const significantPlaces = (d) => Math.max(0, SIGNIFICANT - 1 - adjusted(d));

  /** |d| rounded half up to ``places`` decimals: {digits, exp: -places}. */
  function rounded(d, places) {
    if (d.exp >= -places) return {neg: false, digits: d.digits * 10n ** BigInt(d.exp + places), exp: -places};
    const unit = 10n ** BigInt(-places - d.exp);
    let q = d.digits / unit;
    if (2n * (d.digits % unit) >= unit) q += 1n;
    return {neg: false, digits: q, exp: -places};
  }

  /** Compare |d| with a whole number n: -1, 0, 1. */
  function compare(d, n) {
    const scale = 10n ** BigInt(Math.max(0, -d.exp));
    const left = d.exp >= 0 ? d.digits * 10n ** BigInt(d.exp) : d.digits;
    const right = BigInt(n) * scale;
    return left < right ? -1 : left > right ? 1 : 0;
  }

  const group = (whole) => whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",");

  /** Fixed-point text of a rounded value, thousands separated, zeros after ``keep`` dropped. */
  function text(r, keep) {
    const places = -r.exp;
    const s = r.digits.toString().padStart(places + 1, "0");
    const whole = group(s.slice(0, s.length - places));
    const frac = s.slice(s.length - places).replace(/0+$/, "").padEnd(keep, "0");
    return frac ? `${whole}.${frac}` : whole;
  }

  function figure(value) {
    const d = parse(value);
    if (!d) return NONE;
    if (isZero(d)) return "0";
    return (d.neg ? "-" : "") + text(rounded(d, significantPlaces(d)), 0);
  }

  function usd(value) {
    const d = parse(value);
    if (!d) return NONE;
    if (isZero(d)) return "$0.00";
    const sign = d.neg ? "-" : "";
    const places = compare(d, 1) >= 0 ? 2 : Math.min(MONEY_PLACES_MAX, Math.max(2, significantPlaces(d)));
    const shown = rounded(d, places);
    if (isZero(shown)) return `${sign}< $0.${"0".repeat(MONEY_PLACES_MAX - 1)}1`;
    return `${sign}$${text(shown, 2)}`;
  }

  function usdPerS(value) {
    return parse(value) ? `${figure(value)} $/s` : NONE;
  }

  function count(value) {
    const d = parse(value);
    if (!d) return NONE;
    const shown = rounded(d, 0);
    return (d.neg && !isZero(shown) ? "-" : "") + text(shown, 0);
  }

  function percent(share) {
    const d = parse(share);
    return d ? `${figure((d.neg ? "-" : "") + `${d.digits}e${d.exp + 2}`)}%` : NONE;
  }

  const UNITS = [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]];

  function duration(seconds) {
    let d = parse(seconds);
    if (!d) return NONE;
    if (d.neg && !isZero(d)) return "-" + duration(`${d.digits}e${d.exp}`);
    if (isZero(d)) return "0 s";
    if (compare(d, 1) < 0) {
      const ms = {...d, exp: d.exp + 3};
      const shown = rounded(ms, significantPlaces(ms));
      if (compare(shown, 1000) < 0) return `${text(shown, 0)} ms`;
      d = parse("1");  // 999.96 ms rounds to a second
    }
    if (compare(d, 60) < 0) {
      const shown = rounded(d, significantPlaces(d));
      if (compare(shown, 60) < 0) return `${text(shown, 0)} s`;
      d = parse("60");  // 59.96 s rounds to a minute
    }
    let left = Number(d.exp >= 0 ? d.digits * 10n ** BigInt(d.exp) : d.digits / 10n ** BigInt(-d.exp));
    const parts = [];
    for (const [unit, size] of UNITS) {
      if (left >= size || parts.length) {
        parts.push([Math.floor(left / size), unit]);
        left %= size;
      }
      if (parts.length === 2) break;
    }
    if (parts.length === 2 && parts[1][0] === 0) parts.pop();
    return parts.map(([n, unit]) => `${n} ${unit}`).join(" ");
  }

  function exact(value) {
    const d = parse(value);
    if (!d) return NONE;
    const places = Math.max(0, -d.exp);
    const t = text(rounded(abs(d), places), 0).replace(/,/g, "");
    return t === "0" ? "0" : (d.neg ? "-" : "") + t;
  }

  return {figure, usd, usdPerS, count, percent, duration, exact};
})();

if (typeof module !== "undefined") module.exports = numbers;  // node, for the tests
