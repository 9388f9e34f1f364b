// The console's live pages: every data-refresh seconds of <main id="live">, fetch this
// same page again (same origin, with the session cookie) and swap the new <main> in.
// Stops when the page says 0, or when an answer is not a page (signed out, gone).
(function () {
  "use strict";
  function period() {
    var main = document.getElementById("live");
    return main ? Number(main.getAttribute("data-refresh") || "0") : 0;
  }
  function tick() {
    fetch(window.location.href, {credentials: "same-origin", cache: "no-store",
                                 redirect: "error", headers: {"X-Console-Live": "1"}})
      .then(function (r) {
        if (r.status !== 200) { throw new Error("status " + r.status); }
        return r.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        var main = document.getElementById("live");
        if (!fresh || !main) { throw new Error("no live part"); }
        main.replaceWith(document.importNode(fresh, true));
        document.body.setAttribute("data-refreshed", String(Date.now()));
        schedule();
      })
      .catch(function () { document.body.setAttribute("data-live", "stopped"); });
  }
  function schedule() {
    var every = period();
    if (every > 0) { window.setTimeout(tick, every * 1000); }
  }
  schedule();
})();
