// The run page's one script: it follows a run that has not ended over the
// API's event stream (the same GET /v1/jobs/{id}/events, or a session
// call's, a client reads; the page's cookie authorizes it), appending its
// output as it is written, and reloads the page once the result is in.
"use strict";
(function () {
  function text(raw) {
    var v = JSON.parse(raw);
    if (v.data_base64) {
      var bin = atob(v.data_base64), bytes = new Uint8Array(bin.length);
      for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      return new TextDecoder().decode(bytes);
    }
    return v.data || "";
  }
  document.querySelectorAll("[data-events]").forEach(function (run) {
    var part = function (role) { return run.querySelector('[data-role="' + role + '"]'); };
    var es = new EventSource(run.getAttribute("data-events"));
    es.addEventListener("stdout", function (e) { part("stdout").textContent += text(e.data); });
    es.addEventListener("stderr", function (e) { part("stderr").textContent += text(e.data); });
    es.addEventListener("status", function (e) {
      var st = JSON.parse(e.data).status, badge = part("status");
      badge.textContent = st;
      badge.className = "status status-" + st;
    });
    es.addEventListener("result", function () {
      es.close();
      window.location.reload();
    });
  });
})();
