// What-if panel: POST the sweep form, draw the returned figure or say what went wrong.
(function () {
  "use strict";
  const form = document.getElementById("whatif-form");
  if (!form) return;
  const status = document.getElementById("whatif-status");
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    status.textContent = "running the offline simulator…";
    fetch(form.action, { method: "POST", body: new FormData(form), credentials: "same-origin" })
      .then(function (r) { return r.json().then(function (body) { return { ok: r.ok, body: body }; }); })
      .then(function (res) {
        if (!res.ok) {
          const b = res.body;
          status.textContent = b.detail || Object.keys(b).map(function (k) { return k + ": " + b[k]; }).join("; ");
          return;
        }
        status.textContent = "replayed " + res.body.requests + " requests on " + res.body.engines +
          " simulated " + res.body.profile + " engines";
        window.kvrouteCharts.draw(document.getElementById("whatif-chart"), res.body.figure);
      })
      .catch(function (err) { status.textContent = "failed: " + err; });
  });
})();
