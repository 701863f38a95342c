"use strict";
// Prometheus text -> per-model request rate, error rate and latency percentiles between two polls.
// Pure functions on window.LanternMetrics, so that the browser test can call them directly.
(function () {
  const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
  const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

  function parse(text) {
    const samples = [];
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = LINE.exec(line);
      if (!m) continue;
      const labels = {};
      for (const l of (m[2] || "").matchAll(LABEL)) labels[l[1]] = l[2].replace(/\\(.)/g, "$1");
      samples.push({ name: m[1], labels, value: Number(m[3]) });
    }
    return samples;
  }

  // {model: {requests, errors, buckets: {le: cumulative count}}}, versions summed.
  function summarise(samples) {
    const out = {};
    const entry = (model) => (out[model] ||= { requests: 0, errors: 0, buckets: {} });
    for (const s of samples) {
      const model = s.labels.model;
      if (!model) continue;
      if (s.name === "serve_requests_total") {
        const e = entry(model);
        e.requests += s.value;
        if (Number(s.labels.status) >= 400) e.errors += s.value;
      } else if (s.name === "serve_request_duration_seconds_bucket") {
        const b = entry(model).buckets;
        b[s.labels.le] = (b[s.labels.le] || 0) + s.value;
      }
    }
    return out;
  }

  // Prometheus's histogram_quantile over cumulative buckets {le: count}.
  function quantile(q, buckets) {
    const les = Object.keys(buckets).sort((a, b) => Number(a) - Number(b));
    if (!les.length) return NaN;
    const total = buckets[les[les.length - 1]];
    if (!(total > 0)) return NaN;
    const rank = q * total;
    let prevLe = 0, prevCount = 0;
    for (const le of les) {
      const count = buckets[le];
      if (count >= rank) {
        if (le === "+Inf") return prevLe;
        const upper = Number(le);
        if (count === prevCount) return upper;
        return prevLe + (upper - prevLe) * ((rank - prevCount) / (count - prevCount));
      }
      prevLe = Number(le);
      prevCount = count;
    }
    return prevLe;
  }

  // Rates and percentiles between two summaries taken `seconds` apart.
  function between(before, after, seconds) {
    const rows = {};
    for (const [model, now] of Object.entries(after)) {
      const then = before[model] || { requests: 0, errors: 0, buckets: {} };
      const delta = {};
      for (const [le, c] of Object.entries(now.buckets)) delta[le] = c - (then.buckets[le] || 0);
      rows[model] = {
        rate: (now.requests - then.requests) / seconds,
        errors: (now.errors - then.errors) / seconds,
        p50: quantile(0.5, delta) * 1000,
        p99: quantile(0.99, delta) * 1000,
      };
    }
    return rows;
  }

  window.LanternMetrics = { parse, summarise, quantile, between };
})();
