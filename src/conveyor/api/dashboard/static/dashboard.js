// conveyor dashboard: refresh each [data-refresh] element every 2 s from the same page's ?fragment=1,
// which answers only that element's content (the template's "live" block). No framework, no build step.
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  function refresh(el) {
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (response) {
        if (response.redirected || !response.ok) { return null; }
        return response.text();
      })
      .then(function (html) {
        if (html !== null) { el.innerHTML = html; }
      })
      .catch(function () { /* the server is away for a moment: try again at the next tick */ })
      .finally(function () { window.setTimeout(function () { refresh(el); }, PERIOD_MS); });
  }
  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    window.setTimeout(function () { refresh(el); }, PERIOD_MS);
  });
})();
