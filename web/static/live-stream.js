// One live stream (`GET /events`) for a set of rollouts that may change
// while it is open: the set changes with a short request naming the stream
// (`/events/{stream}/watch`), never with a new connection. Used by the
// shared worker (live-worker.js) and, in a browser without SharedWorker, by
// the leader tab (app.js).
var WaveguardLiveStream = function (onChange, onClosed) {
  "use strict";
  var source = null;
  var stream = null;
  var opened = "";
  var watching = null;
  var ids = "";
  function sync() {
    if (!source) {
      open();
    } else if (stream && watching !== ids) {
      watching = ids;
      fetch("/events/" + stream + "/watch?rollouts=" + ids, { credentials: "same-origin" })
        .catch(function () { /* the stream's next hello sends the set again */ });
    }
  }
  function open() {
    var own = new EventSource("/events?rollouts=" + ids);
    source = own;
    opened = ids;
    own.addEventListener("hello", function (event) {
      // A new stream (first open or a reconnect) watches what its URL said,
      // which may be older than the set wanted now.
      stream = JSON.parse(event.data).stream;
      watching = opened;
      sync();
    });
    own.addEventListener("rollout", function (event) {
      onChange(JSON.parse(event.data));
    });
    own.addEventListener("error", function () {
      // EventSource reconnects by itself; it gives up only when the server
      // refuses (the session ended).
      if (own.readyState === EventSource.CLOSED && source === own) {
        source = null;
        stream = null;
        if (onClosed) onClosed();
      }
    });
  }
  return {
    watch: function (list) {
      ids = list.slice().sort(function (a, b) { return a - b; }).join(",");
      sync();
    },
    close: function () {
      if (source) source.close();
      source = null;
      stream = null;
    }
  };
};
