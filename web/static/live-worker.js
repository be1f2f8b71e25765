// The browser's one live stream, shared by all its tabs of this origin.
//
// A browser keeps at most six HTTP/1.1 connections per host; a stream per
// tab would hold one each and the seventh tab would never load. Each tab
// (app.js) connects here with its session's key and the rollouts it shows;
// this worker holds one stream per session for the union of them and passes
// each rollout's changes to the tabs showing that rollout.
"use strict";
importScripts("/static/live-stream.js");

// Session key -> { stream, ports: Map(port -> [rollout ids]) }. Keyed by
// session because the server renders what it sends for the stream's user.
var sessions = new Map();

function session(key) {
  var known = sessions.get(key);
  if (known) return known;
  var created = { ports: new Map(), stream: null };
  created.stream = WaveguardLiveStream(function (change) {
    created.ports.forEach(function (list, port) {
      if (list.indexOf(change.rollout) >= 0) port.postMessage({ change: change });
    });
  }, function () {
    created.ports.forEach(function (_, port) { port.postMessage({ closed: true }); });
  });
  sessions.set(key, created);
  return created;
}

function update(key) {
  var s = sessions.get(key);
  if (!s) return;
  if (s.ports.size === 0) {
    s.stream.close();
    sessions.delete(key);
    return;
  }
  var ids = new Set();
  s.ports.forEach(function (list) { list.forEach(function (id) { ids.add(id); }); });
  s.stream.watch(Array.from(ids));
}

self.addEventListener("connect", function (event) {
  var port = event.ports[0];
  var key = null;
  port.addEventListener("message", function (message) {
    var data = message.data || {};
    if (data.watch) {
      key = String(data.session || "");
      session(key).ports.set(port, data.watch.map(Number));
      update(key);
    } else if (data.bye && key !== null && sessions.has(key)) {
      sessions.get(key).ports.delete(port);
      update(key);
    }
  });
  port.start();
});
