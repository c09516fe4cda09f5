// A session's page follows its run (issue #19). On a fleet it reads the session's event stream (issue #34): the
// model's text shows as it is written, tool calls as they start and finish, and the page reloads when a save
// lands (the checkpoint is the truth). Elsewhere (no stream), it asks for its save number every 2 s and reloads
// when a new save lands. No build step, no framework, no inline script (the dashboard's CSP).
(function () {
  const status = document.getElementById("session-status");
  if (!status || !status.hasAttribute("data-follow")) return;

  function reload() {
    location.replace(location.pathname);  // without the note of the action that led here
  }

  function poll() {
    const timer = setInterval(async function () {
      try {
        const response = await fetch(status.dataset.versionUrl, { headers: { "Accept": "application/json" } });
        if (!response.ok) return;
        const now = await response.json();
        if (String(now.version) !== status.dataset.version) {
          clearInterval(timer);
          reload();
        }
      } catch (e) { /* the next poll tries again */ }
    }, 2000);
  }

  function stream(url) {
    const live = document.getElementById("live");
    const text = document.getElementById("live-text");
    const events = document.getElementById("live-events");
    const source = new EventSource(url);
    function line(words) {
      const item = document.createElement("li");
      item.textContent = words;
      events.appendChild(item);
      live.hidden = false;
    }
    source.addEventListener("turn-started", function (message) {
      const event = JSON.parse(message.data);
      text.textContent = "";  // a new attempt (or provider try) of the turn: what it wrote before is dropped
      line("turn " + event.turn + ", attempt " + event.attempt + " started");
    });
    source.addEventListener("text-delta", function (message) {
      text.textContent += JSON.parse(message.data).text;
      live.hidden = false;
    });
    ["tool-call-started", "tool-call-finished"].forEach(function (kind) {
      source.addEventListener(kind, function (message) {
        const data = JSON.parse(message.data).data;
        line("tool " + data.name + " #" + data.call_id + " " + kind.split("-").pop());
      });
    });
    source.addEventListener("checkpoint-saved", function (message) {
      if (String(JSON.parse(message.data).data.version) !== status.dataset.version) {
        source.close();
        reload();
      }
    });
    source.addEventListener("end", function () {
      source.close();  // the run waits (an approval) or finished: the saves say the rest
      poll();
    });
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED) poll();  // no stream after all: look at the saves
    };
  }

  if (status.dataset.eventsUrl && window.EventSource) {
    stream(status.dataset.eventsUrl);
  } else {
    poll();
  }
})();
