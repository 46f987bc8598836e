// Draws every <div data-figure="ID"> from the JSON in <script id="ID">, with Plotly
// served by this app (no CDN). Exposes window.kvrouteCharts for page scripts.
(function () {
  "use strict";
  const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  function draw(div, fig) {
    return Plotly.react(div, fig.data, fig.layout, CONFIG);
  }

  function figureOf(div) {
    const el = document.getElementById(div.dataset.figure);
    return el ? JSON.parse(el.textContent) : null;
  }

  function drawAll() {
    document.querySelectorAll("[data-figure]").forEach(function (div) {
      if (div.dataset.live === "1") return; // live pages draw these themselves
      const fig = figureOf(div);
      if (fig) draw(div, fig);
    });
  }

  window.kvrouteCharts = { draw: draw, figureOf: figureOf, config: CONFIG };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", drawAll);
  else drawAll();
})();
