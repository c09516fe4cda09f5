// Live sessions table (issue #19): poll the server-rendered rows every 2 s; no build step, no framework.
(function () {
  // Picking a status filters at once (here, not in an inline handler: the CSP allows no inline script, issue #31).
  const filter = document.getElementById("status-filter");
  if (filter) filter.addEventListener("change", function () { filter.form.submit(); });
  const body = document.getElementById("session-rows");
  const live = document.getElementById("live");
  if (!body) return;
  async function refresh() {
    if (live && !live.checked) return;
    try {
      const response = await fetch(body.dataset.rowsUrl, { headers: { "Accept": "text/html" } });
      if (!response.ok) return;
      body.innerHTML = await response.text();
      const shown = document.getElementById("pager-shown");
      if (shown && response.headers.get("X-Lousho-Shown")) shown.textContent = response.headers.get("X-Lousho-Shown");
    } catch (e) { /* the next poll tries again */ }
  }
  setInterval(refresh, 2000);
})();
