// conveyor dashboard: keep each [data-refresh] element current from the same page's ?fragment=1, which
// answers only that element's content (the template's "live" block). No framework, no build step.
// An element with data-changes="URL" listens to that Server-Sent Events stream and fetches its content when
// the stream says "changed" (at most one fetch at a time, at most one a second), stops on "end" (the run is
// over); without it, or if the stream cannot be opened, it fetches every 2 s.
(function () {
  "use strict";
  var PERIOD_MS = 2000;
  var MIN_GAP_MS = 1000;

  function fetchFragment(el) {
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    return fetch(url.toString(), {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (response) {
        if (response.redirected || !response.ok) { return null; }
        return response.text();
      })
      .then(function (html) {
        if (html !== null) { el.innerHTML = html; }
      })
      .catch(function () { /* the server is away for a moment: the next change or tick tries again */ });
  }

  function poll(el) {
    fetchFragment(el).finally(function () { window.setTimeout(function () { poll(el); }, PERIOD_MS); });
  }

  function listen(el, url) {
    var busy = false, again = false, last = 0;
    function update() {
      if (busy) { again = true; return; }
      var wait = Math.max(0, last + MIN_GAP_MS - Date.now());
      busy = true;
      window.setTimeout(function () {
        last = Date.now();
        fetchFragment(el).finally(function () {
          busy = false;
          if (again) { again = false; update(); }
        });
      }, wait);
    }
    var source = new EventSource(url, {withCredentials: true});
    var opened = false;
    source.addEventListener("open", function () { opened = true; });
    source.addEventListener("changed", update);
    source.addEventListener("end", function () { source.close(); update(); });
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED) {  // refused (a lost session): poll as before
        if (!opened) { window.setTimeout(function () { poll(el); }, PERIOD_MS); }
      }
    });
  }

  document.querySelectorAll("[data-refresh]").forEach(function (el) {
    if (el.dataset.changes && window.EventSource) {
      listen(el, el.dataset.changes);
    } else {
      window.setTimeout(function () { poll(el); }, PERIOD_MS);
    }
  });
})();
