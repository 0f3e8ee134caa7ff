// conveyor dashboard, the review queue: keyboard shortcuts, the selection for bulk decisions, and each
// deadline as a countdown. Without this script the page still works: every decision is a plain form.
//   j / k  next / previous entry      o  open or close it (its answer and the reject box)
//   x      select it                  a  approve it       r  reject it (opens it, focuses the reason)
//   e      edit it (its own page)
(function () {
  "use strict";
  var entries = Array.prototype.slice.call(document.querySelectorAll("article[data-review]"));
  var current = -1;

  function focusEntry(index) {
    if (!entries.length) { return; }
    index = Math.max(0, Math.min(entries.length - 1, index));
    if (current >= 0 && entries[current]) { entries[current].classList.remove("current"); }
    current = index;
    entries[current].classList.add("current");
    entries[current].focus({preventScroll: true});
    entries[current].scrollIntoView({block: "nearest"});
  }

  function typing(target) {
    var tag = target && target.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || (target && target.isContentEditable);
  }

  function countSelected() {
    var boxes = document.querySelectorAll('input[name="ids"][form="bulk"]');
    var chosen = Array.prototype.filter.call(boxes, function (b) { return b.checked; }).length;
    var label = document.querySelector("[data-selected-count]");
    if (label) { label.textContent = chosen + " selected"; }
    var all = document.querySelector("[data-select-all]");
    if (all) { all.checked = chosen > 0 && chosen === boxes.length; }
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) { return; }
    var entry = current >= 0 ? entries[current] : null;
    switch (event.key) {
      case "j": focusEntry(current + 1); break;
      case "k": focusEntry(current - 1); break;
      case "o":
      case "Enter":
        if (!entry) { return; }
        var details = entry.querySelector("details");
        if (details) { details.open = !details.open; }
        break;
      case "x":
        if (!entry) { return; }
        var box = entry.querySelector('input[name="ids"]');
        if (box) { box.checked = !box.checked; countSelected(); }
        break;
      case "a":
        if (!entry) { return; }
        entry.querySelector("form[data-approve]").requestSubmit();
        break;
      case "r":
        if (!entry) { return; }
        entry.querySelector("details").open = true;
        entry.querySelector("[data-why]").focus();
        break;
      case "e":
        if (!entry) { return; }
        window.location.assign(entry.querySelector("a[data-edit]").href);
        break;
      default: return;
    }
    event.preventDefault();
  });

  entries.forEach(function (entry, index) {
    entry.addEventListener("click", function () { if (current !== index) { focusEntry(index); } });
  });
  document.querySelectorAll('input[name="ids"][form="bulk"]').forEach(function (box) {
    box.addEventListener("change", countSelected);
  });
  var all = document.querySelector("[data-select-all]");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll('input[name="ids"][form="bulk"]').forEach(function (box) { box.checked = all.checked; });
      countSelected();
    });
  }

  // Deadlines count down from the store's clock at render time (data-now), not the browser's: a skewed
  // laptop clock does not make an entry look overdue.
  var loaded = Date.now() / 1000;
  function span(seconds) {
    var s = Math.abs(Math.round(seconds));
    var d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) { return d + "d " + h + "h"; }
    if (h) { return h + "h " + m + "m"; }
    if (m) { return m + "m " + (s % 60) + "s"; }
    return s + "s";
  }
  function tick() {
    var elapsed = Date.now() / 1000 - loaded;
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var left = parseFloat(el.dataset.deadline) - parseFloat(el.dataset.now) - elapsed;
      el.textContent = left > 0 ? "due in " + span(left) : "overdue by " + span(left);
      el.classList.toggle("overdue", left <= 0);
    });
  }
  tick();
  window.setInterval(tick, 1000);
  countSelected();
})();
