// The Usage page's charts: one GET /admin/api/usage/series (the page's own query) drawn with uPlot as
// requests and errors, prompt and completion tokens, and p50 / p95 latency per bucket, in UTC like the rest
// of the admin UI. Labels come from data-* attributes; the table below the charts holds the same data as text.
(function () {
  "use strict";
  var HEIGHT = 220;
  var charts = [];

  function width(target) {
    return Math.max(280, target.clientWidth);
  }

  // Ticks as 24-hour UTC times, the date under the first tick and at midnight (the tables speak UTC too).
  function ticks(u, splits) {
    return splits.map(function (ts, i) {
      var text = new Date(ts * 1e3).toISOString();
      var date = text.slice(0, 10), time = text.slice(11, 16);
      if (time === "00:00") return date;
      return i === 0 ? time + "\n" + date : time;
    });
  }

  function stamp(u, ts) {
    return ts == null ? "–" : new Date(ts * 1e3).toISOString().slice(0, 16).replace("T", " ") + " UTC";
  }

  function draw(target, series, data, unit) {
    var opts = {
      width: width(target),
      height: HEIGHT,
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },  // ticks on UTC hours
      scales: { x: { time: true } },
      series: [{ value: stamp }].concat(series),
      axes: [{ values: ticks, space: 60 }, unit ? { size: 60, label: unit } : { size: 60 }],
    };
    var chart = new uPlot(opts, data, target);
    charts.push({ chart: chart, target: target });
    return chart;
  }

  function column(points, name) {
    return points.map(function (p) { return p[name]; });
  }

  var COLOURS = ["#1f5fbf", "#b3261e", "#146c2e", "#8a5300", "#6b3fa0", "#00758f"];

  function sum(values) { return values.reduce(function (a, b) { return a + (b || 0); }, 0); }

  function withFilter(url, name, value) {
    return url + (url.indexOf("?") < 0 ? "?" : "&") + encodeURIComponent(name) + "=" + encodeURIComponent(value);
  }

  // One line per key / model / worker / endpoint: the series the API answers with that value as its filter.
  async function loadSplit(box, d, lines) {
    var answers = await Promise.all(lines.map(function (value) {
      return turnout.api("GET", withFilter(d.series, d.split, value));
    }));
    var series = answers.map(function (r) { return r.body.points; });
    var xs = column(series[0], "bucket_start");
    function lineSet(valueOf) {
      return [xs].concat(series.map(function (points) { return points.map(valueOf); }));
    }
    function labels(extra) {
      return lines.map(function (value, i) {
        var label = d.split === "key" ? value + "…" : value;
        return Object.assign({ label: label, stroke: COLOURS[i % COLOURS.length], width: 2 }, extra || {});
      });
    }
    var ms = { value: function (u, v) { return v == null ? "–" : Math.round(v) + " ms"; } };
    draw(document.getElementById("chart-requests"), labels(), lineSet(function (p) { return p.requests; }));
    draw(document.getElementById("chart-tokens"), labels(),
      lineSet(function (p) { return p.prompt_tokens + p.completion_tokens; }));
    draw(document.getElementById("chart-latency"), labels(ms), lineSet(function (p) { return p.latency_ms_p95; }), "ms");
    document.getElementById("chart-requests-title").textContent = d.titleRequests;
    document.getElementById("chart-tokens-title").textContent = d.titleTokens;
    document.getElementById("chart-latency-title").textContent = d.titleLatency;
    box.dataset.points = String(xs.length);
    box.dataset.requests = String(sum(series.map(function (points) { return sum(column(points, "requests")); })));
  }

  async function load() {
    var box = document.getElementById("charts");
    if (!box || !window.uPlot) return;
    var d = box.dataset;
    var lines = JSON.parse(d.lines || "[]");
    try {
      if (d.split && lines.length) {
        await loadSplit(box, d, lines);
        box.dataset.lineCount = String(lines.length);
        box.dataset.ready = "yes";
        return;
      }
      var r = await turnout.api("GET", d.series);
      var points = r.body.points;
      var xs = column(points, "bucket_start");
      draw(document.getElementById("chart-requests"), [
        { label: d.labelRequests, stroke: "#1f5fbf", fill: "rgba(31, 95, 191, 0.12)", width: 2 },
        { label: d.labelErrors, stroke: "#b3261e", width: 2 },
      ], [xs, column(points, "requests"), column(points, "errors")]);
      draw(document.getElementById("chart-tokens"), [
        { label: d.labelPrompt, stroke: "#146c2e", width: 2 },
        { label: d.labelCompletion, stroke: "#8a5300", width: 2 },
      ], [xs, column(points, "prompt_tokens"), column(points, "completion_tokens")]);
      draw(document.getElementById("chart-latency"), [
        { label: d.labelP50, stroke: "#1f5fbf", width: 2, value: function (u, v) { return v == null ? "–" : Math.round(v) + " ms"; } },
        { label: d.labelP95, stroke: "#6b3fa0", width: 2, value: function (u, v) { return v == null ? "–" : Math.round(v) + " ms"; } },
      ], [xs, column(points, "latency_ms_p50"), column(points, "latency_ms_p95")], "ms");
      box.dataset.points = String(points.length);
      box.dataset.requests = String(column(points, "requests").reduce(function (a, b) { return a + b; }, 0));
      box.dataset.ready = "yes";
    } catch (err) {
      var out = document.getElementById("charts-error");
      out.textContent = turnout.forms ? turnout.forms.fmt(d.msgFailed, { message: err.message }) : err.message;
      out.hidden = false;
      box.dataset.ready = "failed";
    }
  }

  var pending = null;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(function () {
      charts.forEach(function (c) { c.chart.setSize({ width: width(c.target), height: HEIGHT }); });
    }, 150);
  });

  document.addEventListener("DOMContentLoaded", load);
})();
