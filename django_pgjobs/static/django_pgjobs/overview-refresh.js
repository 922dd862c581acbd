/* django-pgjobs admin overview: refresh the live part of the page in place.
 *
 * Every data-refresh-seconds, fetch data-refresh-url (the same view with
 * ?fragment=live, which renders only that part) and swap it in. No reload, no
 * library. A failed fetch (server down, session expired: a redirect to the
 * login page) keeps the last content and dims it until a fetch succeeds.
 */
(function () {
  "use strict";
  var live = document.getElementById("pgjobs-live");
  if (!live || !window.fetch) { return; }
  var seconds = parseFloat(live.getAttribute("data-refresh-seconds")) || 10;
  var url = live.getAttribute("data-refresh-url");
  var busy = false;

  function refresh() {
    if (busy || document.hidden) { return; }
    busy = true;
    fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "XMLHttpRequest" } })
      .then(function (response) {
        if (!response.ok || response.redirected) { throw new Error("HTTP " + response.status); }
        return response.text();
      })
      .then(function (html) {
        live.innerHTML = html;
        live.classList.remove("pgjobs-refresh-failed");
        live.setAttribute("data-refreshed-at", String(Date.now()));
      })
      .catch(function () { live.classList.add("pgjobs-refresh-failed"); })
      .then(function () { busy = false; });
  }

  window.setInterval(refresh, seconds * 1000);
})();
