// Progressive enhancement: every page works without this file (forms post
// and redirect, confirmations are their own page). With it, actions ask in
// a dialog and post in the background, and the rollout page updates live
// from server-sent events.
(function () {
  "use strict";
  function csrf() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : "";
  }
  function flash(text, kind, link) {
    var box = document.getElementById("flash");
    if (!box) return;
    box.innerHTML = "";
    var p = document.createElement("p");
    p.className = "flash " + (kind || "ok");
    p.textContent = text;
    if (link) {
      var a = document.createElement("a");
      a.href = link;
      a.id = "flash-link";
      a.textContent = "Open " + link;
      p.appendChild(document.createTextNode(" "));
      p.appendChild(a);
    }
    box.appendChild(p);
  }
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.matches || !form.matches("form[data-confirm]")) return;
    event.preventDefault();
    if (!window.confirm(form.getAttribute("data-confirm"))) return;
    var body = new URLSearchParams(new FormData(form));
    body.set("confirmed", "yes");
    fetch(form.action, {
      method: "POST",
      body: body,
      credentials: "same-origin",
      headers: { "Accept": "application/json", "X-CSRF-Token": csrf() }
    }).then(function (response) {
      return response.json().catch(function () { return {}; }).then(function (data) {
        if (response.ok && data.location) {
          // Something new was created elsewhere: say so and link to it.
          flash(data.message || "Done.", "ok", data.location);
        } else if (response.ok) {
          flash(data.message || "Done.", "ok");
          if (!document.getElementById("live")) window.location.reload();
        } else {
          flash((data.error && data.error.message) || ("Refused (" + response.status + ")"), "err");
        }
      });
    }).catch(function () { flash("The server did not answer.", "err"); });
  });
  var live = document.getElementById("live");
  if (live && window.EventSource) {
    var source = new EventSource(live.getAttribute("data-events"));
    source.addEventListener("progress", function (event) {
      live.innerHTML = event.data;
      live.setAttribute("data-updated", String(Date.now()));
    });
    source.addEventListener("nodes", function (event) {
      var nodes = document.getElementById("live-nodes");
      if (nodes) nodes.innerHTML = event.data;
    });
  }
  // The error page's Back link: history.back() from here, because the
  // Content-Security-Policy refuses javascript: URLs (without this file the
  // link goes to the overview).
  document.querySelectorAll("[data-back]").forEach(function (link) {
    link.addEventListener("click", function (event) {
      if (window.history.length > 1) {
        event.preventDefault();
        window.history.back();
      }
    });
  });
})();
