// A session's page follows its run (issue #19): while it is not finished, ask for its save number every 2 s
// and reload the page when a new save lands. No build step, no framework.
(function () {
  const status = document.getElementById("session-status");
  if (!status || !status.hasAttribute("data-follow")) return;
  const timer = setInterval(async function () {
    try {
      const response = await fetch(status.dataset.versionUrl, { headers: { "Accept": "application/json" } });
      if (!response.ok) return;
      const now = await response.json();
      if (String(now.version) !== status.dataset.version) {
        clearInterval(timer);
        location.replace(location.pathname);  // without the note of the action that led here
      }
    } catch (e) { /* the next poll tries again */ }
  }, 2000);
})();
