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

  async function load() {
    var box = document.getElementById("charts");
    if (!box || !window.uPlot) return;
    var d = box.dataset;
    try {
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
