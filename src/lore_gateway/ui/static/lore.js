// lore memory browser: theme, keyboard, charts and live updates. No build step.
(function () {
  "use strict";
  var root = document.documentElement;
  var saved = null;
  try { saved = localStorage.getItem("lore-theme"); } catch (e) { /* private mode */ }
  if (saved) root.setAttribute("data-theme", saved);

  function currentTheme() {
    var set = root.getAttribute("data-theme");
    if (set) return set;
    return window.matchMedia && matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }

  window.lore = { charts: {}, series: null };

  document.addEventListener("DOMContentLoaded", function () {
    var toggle = document.getElementById("theme");
    if (toggle) {
      toggle.textContent = currentTheme() === "dark" ? "Light theme" : "Dark theme";
      toggle.addEventListener("click", function () {
        var next = currentTheme() === "dark" ? "light" : "dark";
        root.setAttribute("data-theme", next);
        try { localStorage.setItem("lore-theme", next); } catch (e) { /* ignore */ }
        toggle.textContent = next === "dark" ? "Light theme" : "Dark theme";
        if (window.lore.series) drawCharts(window.lore.series);
      });
    }
    // "/" jumps to the search field (or the search page), as on most sites.
    document.addEventListener("keydown", function (ev) {
      if (ev.key !== "/" || ev.ctrlKey || ev.metaKey || ev.altKey) return;
      var tag = (document.activeElement && document.activeElement.tagName) || "";
      if (tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT") return;
      var q = document.getElementById("q");
      ev.preventDefault();
      if (q) { q.focus(); q.select(); } else { window.location.href = "/ui/search"; }
    });
    // j / k move between the turns of a session (each turn is focusable).
    document.addEventListener("keydown", function (ev) {
      if ((ev.key !== "j" && ev.key !== "k") || ev.ctrlKey || ev.metaKey || ev.altKey) return;
      var tag = (document.activeElement && document.activeElement.tagName) || "";
      if (tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT") return;
      var turns = Array.prototype.slice.call(document.querySelectorAll("article.turn"));
      if (!turns.length) return;
      var at = turns.indexOf(document.activeElement.closest ? document.activeElement.closest("article.turn") : null);
      var next = ev.key === "j" ? Math.min(at + 1, turns.length - 1) : Math.max(at - 1, 0);
      turns[next].setAttribute("tabindex", "-1");
      turns[next].focus();
      ev.preventDefault();
    });
    document.addEventListener("submit", function (ev) {
      var form = ev.target;
      var question = form.getAttribute && form.getAttribute("data-confirm");
      if (question && !window.confirm(question)) ev.preventDefault();
    });
    document.addEventListener("click", function (ev) {
      var which = ev.target.getAttribute && ev.target.getAttribute("data-expand");
      if (!which) return;
      document.querySelectorAll("#turns details.msg").forEach(function (d) { d.open = which === "all"; });
    });
    var data = document.getElementById("series");
    if (data) {
      window.lore.series = JSON.parse(data.textContent);
      drawCharts(window.lore.series);
      window.addEventListener("resize", function () { drawCharts(window.lore.series); });
    }
    document.querySelectorAll("[data-live]").forEach(startLive);
  });

  function startLive(el) {
    if (!window.EventSource) return;
    var state = document.getElementById("live-state");
    var source = new EventSource(el.getAttribute("data-live"));
    source.addEventListener("overview", function (ev) {
      window.lore.series = JSON.parse(ev.data);
      drawCharts(window.lore.series);
      updateTotals(window.lore.series.totals);
      if (state) state.textContent = "Live · updated " + new Date().toLocaleTimeString();
    });
    var first = true;
    source.addEventListener("session", function (ev) {
      el.setAttribute("data-version", ev.data);
      if (first) { first = false; return; }  // the page already shows this version
      var open = {};
      el.querySelectorAll("details[id]").forEach(function (d) { if (d.open) open[d.id] = true; });
      document.body.addEventListener("htmx:afterSwap", function restore() {
        document.body.removeEventListener("htmx:afterSwap", restore);
        Object.keys(open).forEach(function (id) { var d = document.getElementById(id); if (d) d.open = true; });
      });
      document.body.dispatchEvent(new CustomEvent("lore:session-changed"));
      if (state) state.textContent = "updated " + new Date().toLocaleTimeString();
    });
    source.onerror = function () { if (state) state.textContent = "reconnecting…"; };
    source.onopen = function () { if (state && state.textContent === "reconnecting…") state.textContent = "live"; };
  }

  function updateTotals(totals) {
    Object.keys(totals).forEach(function (key) {
      var dd = document.querySelector('[data-total="' + key + '"]');
      if (!dd) return;
      var v = totals[key];
      var unit = key === "overhead_ms" ? " ms" : (key === "cache_share" || key === "recall_hit_rate") ? " %" : "";
      dd.textContent = v === null ? "–" : (unit ? v + unit : Number(v).toLocaleString("en-US"));
    });
  }

  var PALETTE = { light: ["#2457c5", "#c2410c"], dark: ["#8fb3ff", "#fb923c"] };

  function drawCharts(s) {
    if (!window.uPlot) return;
    var theme = currentTheme();
    var colours = PALETTE[theme];
    var axis = theme === "dark" ? "#a0a6b0" : "#5f6570";
    var grid = theme === "dark" ? "#33373f" : "#e5e3de";
    var defs = {
      requests: [["requests", s.requests]],
      tokens: [["up", s.tokens_in], ["down", s.tokens_out]],
      cache_share: [["cache read %", s.cache_share]],
      recall_calls: [["recall calls", s.recall_calls]],
      recall_hit_rate: [["hit rate %", s.recall_hit_rate]],
      overhead_ms: [["overhead ms", s.overhead_ms]]
    };
    document.querySelectorAll("figure[data-chart]").forEach(function (fig) {
      var key = fig.getAttribute("data-chart");
      var percent = fig.getAttribute("data-unit") === "%";
      var lines = defs[key];
      var plot = fig.querySelector(".plot");
      var width = Math.max(200, plot.clientWidth || fig.clientWidth - 16);
      var data = [s.t].concat(lines.map(function (l) { return l[1]; }));
      var series = [{}].concat(lines.map(function (l, i) {
        // Points are drawn too: a ratio with one busy slot is a single dot, not a line.
        return { label: l[0], stroke: colours[i], width: 2, fill: i === 0 ? colours[i] + "22" : undefined,
                 spanGaps: false, points: { show: true, size: 5, fill: colours[i] } };
      }));
      var old = window.lore.charts[key];
      if (old && old.width === width && old.theme === theme) { old.chart.setData(data); return; }
      if (old) old.chart.destroy();
      plot.innerHTML = "";
      var chart = new uPlot({
        width: width, height: 180, series: series, legend: { show: lines.length > 1 },
        cursor: { drag: { x: false, y: false } },
        scales: percent ? { y: { range: [0, 100] } } : { y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
        axes: [{ stroke: axis, grid: { stroke: grid } }, { stroke: axis, grid: { stroke: grid }, size: 56 }]
      }, data, plot);
      window.lore.charts[key] = { chart: chart, width: width, theme: theme };
    });
  }
})();
