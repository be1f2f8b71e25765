// Progressive enhancement: every page works without this file (forms post
// and redirect, confirmations are their own page). With it, actions ask in
// a dialog and post in the background, and the rollout page updates live
// from the browser's one server-sent-events stream (see startLive).
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
          // What was typed is sent: the live page may replace the form now.
          form.reset();
          document.dispatchEvent(new Event("waveguard:sent"));
          if (!document.getElementById("live")) window.location.reload();
        } else {
          flash((data.error && data.error.message) || ("Refused (" + response.status + ")"), "err");
        }
      });
    }).catch(function () { flash("The server did not answer.", "err"); });
  });
  var live = document.getElementById("live");
  if (live) startLive(live);

  // ---- Live rollout pages ----
  //
  // The stream says, per rollout, which parts of the page changed (each
  // wave, the state card, ... keyed by element id) and whether a step did;
  // the tab swaps in only those parts and fetches only its own page of the
  // node table. A part holding what the user is typing (the focused field,
  // or a field whose value differs from its default, like a half-typed
  // approval comment) is never replaced: its siblings are updated around
  // it, and what cannot be applied without touching it waits until the
  // field is left or its form is sent.

  function isField(el) {
    return /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName);
  }
  function isDirty(field) {
    var type = (field.type || "").toLowerCase();
    if (type === "hidden" || type === "submit" || type === "button") return false;
    if (field.tagName === "SELECT") {
      return Array.prototype.some.call(field.options, function (o) { return o.selected !== o.defaultSelected; });
    }
    if (type === "checkbox" || type === "radio") return field.checked !== field.defaultChecked;
    return field.value !== field.defaultValue;
  }
  // True when `el` holds the user's input.
  function isGuarded(el) {
    if (el.nodeType !== 1) return false;
    var active = document.activeElement;
    if (active && isField(active) && el.contains(active)) return true;
    var fields = isField(el) ? [el] : el.querySelectorAll("input, textarea, select");
    return Array.prototype.some.call(fields, isDirty);
  }
  function keyOf(node) {
    if (node.nodeType !== 1) return "#" + node.nodeType;
    return node.id ? "#" + node.id
      : [node.tagName, node.className, node.getAttribute("action") || "", node.getAttribute("name") || ""].join("|");
  }
  function parse(html) {
    var template = document.createElement("template");
    template.innerHTML = html;
    return template.content;
  }
  // Makes `old` look like `fresh` without touching the user's input;
  // false when part of it had to wait.
  function patch(old, fresh) {
    if (!isGuarded(old)) {
      old.replaceWith(fresh);
      return true;
    }
    // The user's own field stays as it is, value and all.
    if (isField(old)) return true;
    if (old.tagName !== fresh.tagName) return false;
    Array.prototype.slice.call(old.attributes).forEach(function (a) {
      if (!fresh.hasAttribute(a.name)) old.removeAttribute(a.name);
    });
    Array.prototype.forEach.call(fresh.attributes, function (a) {
      if (old.getAttribute(a.name) !== a.value) old.setAttribute(a.name, a.value);
    });
    return patchChildren(old, fresh);
  }
  // Replaces the children of `old` with those of `fresh` (an element or a
  // parsed fragment); a child holding the user's input is patched in place,
  // never moved or removed (moving it would drop the focus).
  function patchChildren(old, fresh) {
    var ok = true;
    var guarded = Array.prototype.filter.call(old.childNodes, isGuarded);
    var incoming = Array.prototype.slice.call(fresh.childNodes);
    var kept = new Map();
    guarded.forEach(function (g) {
      var twin = incoming.find(function (n) { return keyOf(n) === keyOf(g) && !kept.has(n); });
      if (twin) {
        kept.set(twin, g);
        ok = patch(g, twin) && ok;
      } else {
        // Its part is gone from the new page (say, the wave was promoted):
        // keep it until the user is done with it.
        ok = false;
      }
    });
    Array.prototype.slice.call(old.childNodes).forEach(function (n) {
      if (guarded.indexOf(n) < 0) old.removeChild(n);
    });
    // Insert the new children around the kept ones, in the new order.
    var cursor = old.firstChild;
    incoming.forEach(function (n) {
      var mine = kept.get(n);
      if (mine) {
        cursor = mine.nextSibling;
      } else {
        old.insertBefore(n, cursor);
      }
    });
    return ok;
  }

  function startLive(live) {
    var rollout = Number(live.getAttribute("data-rollout"));
    var pending = {};
    var updates = 0;
    var nodesBusy = false;
    var nodesAgain = false;

    function applyFragment(id, html) {
      var old = id === "" ? live : document.getElementById(id);
      if (!old) return true;
      var fresh = id === "" ? parse(html) : parse(html).firstElementChild;
      if (!fresh) return true;
      var ok = id === "" ? patchChildren(live, fresh) : patch(old, fresh);
      if (ok) delete pending[id]; else pending[id] = html;
      return ok;
    }
    function refreshNodes() {
      if (nodesBusy) { nodesAgain = true; return; }
      nodesBusy = true;
      fetch(live.getAttribute("data-nodes"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          var box = document.getElementById("live-nodes");
          if (html !== null && box) patchChildren(box, parse(html));
        })
        .catch(function () { /* the next change fetches it again */ })
        .then(function () {
          nodesBusy = false;
          if (nodesAgain) { nodesAgain = false; refreshNodes(); }
        });
    }
    function onChange(change) {
      if (change.rollout !== rollout) return;
      if (change.full) {
        pending = {};
        applyFragment("", change.full);
      }
      var parts = change.fragments || {};
      Object.keys(parts).forEach(function (id) { applyFragment(id, parts[id]); });
      if (change.nodes) refreshNodes();
      updates += 1;
      live.setAttribute("data-updated", String(updates));
    }
    function retryPending() {
      // After the event that ended the typing has been handled.
      setTimeout(function () {
        Object.keys(pending).forEach(function (id) { applyFragment(id, pending[id]); });
      }, 0);
    }
    document.addEventListener("focusout", retryPending);
    document.addEventListener("waveguard:sent", retryPending);
    live.setAttribute("data-live", connect(rollout, csrf(), onChange));
  }

  // The one stream per browser: a shared worker where there is one, a
  // leader tab elected over BroadcastChannel and Web Locks where not, and a
  // stream of the tab's own as the last resort. `localStorage
  // ["waveguard.live"] = "leader"` or `"plain"` forces a fallback (tests,
  // diagnosis). Returns the transport's name.
  function connect(rollout, session, onChange) {
    var forced = null;
    try { forced = window.localStorage.getItem("waveguard.live"); } catch (e) { /* storage disabled */ }
    if (window.SharedWorker && !forced) {
      var worker = new SharedWorker("/static/live-worker.js", { name: "waveguard-live" });
      worker.port.addEventListener("message", function (event) {
        if (event.data && event.data.change) onChange(event.data.change);
      });
      worker.port.start();
      var hello = function () { worker.port.postMessage({ session: session, watch: [rollout] }); };
      hello();
      window.addEventListener("pagehide", function () { worker.port.postMessage({ bye: true }); });
      window.addEventListener("pageshow", function (event) { if (event.persisted) hello(); });
      return "shared-worker";
    }
    if (window.BroadcastChannel && navigator.locks && window.WaveguardLiveStream && forced !== "plain") {
      leaderTab(rollout, session, onChange);
      return "leader-tab";
    }
    if (window.WaveguardLiveStream) {
      WaveguardLiveStream(onChange).watch([rollout]);
      return "own-stream";
    }
    return "none";
  }

  // Every tab announces the rollout it shows; the tab holding the lock
  // holds the stream for all of them and rebroadcasts what it receives.
  // When it closes, the lock passes to another tab, which asks who is
  // there and opens the stream again.
  function leaderTab(rollout, session, onChange) {
    var name = "waveguard-live:" + session;
    var channel = new BroadcastChannel(name);
    var me = Math.random().toString(36).slice(2);
    var leader = null;
    function announce() { channel.postMessage({ tab: me, watch: [rollout] }); }
    function lead() {
      var ids = new Set();
      leader.tabs.forEach(function (list) { list.forEach(function (id) { ids.add(id); }); });
      leader.stream.watch(Array.from(ids));
    }
    channel.addEventListener("message", function (event) {
      var data = event.data || {};
      if (data.change) {
        onChange(data.change);
      } else if (data.who) {
        announce();
      } else if (leader && data.watch) {
        leader.tabs.set(data.tab, data.watch);
        lead();
      } else if (leader && data.bye) {
        leader.tabs.delete(data.tab);
        lead();
      }
    });
    announce();
    window.addEventListener("pagehide", function () { channel.postMessage({ tab: me, bye: true }); });
    navigator.locks.request(name, function () {
      leader = { tabs: new Map([[me, [rollout]]]), stream: null };
      leader.stream = WaveguardLiveStream(function (change) {
        onChange(change);
        channel.postMessage({ change: change });
      });
      channel.postMessage({ who: true });
      lead();
      // Held for as long as this tab lives.
      return new Promise(function () {});
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
