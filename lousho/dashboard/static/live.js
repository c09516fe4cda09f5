// Live tables and the navigation's pending-approvals count (issues #19, #32): every 2 s, fetch the server-rendered
// rows of each table marked `live-rows` (the sessions, the approvals) and the count; no build step, no framework.
(function () {
  // Picking a status filters at once (here, not in an inline handler: the CSP allows no inline script, issue #31).
  const filter = document.getElementById("status-filter");
  if (filter) filter.addEventListener("change", function () { filter.form.submit(); });
  const live = document.getElementById("live");
  async function refreshRows(body) {
    if (live && !live.checked) return;
    // Someone typing a note or a result in a row's form: leave the rows alone until they are done.
    const typing = Array.from(body.querySelectorAll("input, select")).some(
      (field) => field === document.activeElement || (field.type !== "hidden" && field.value && field.tagName === "INPUT"));
    if (typing) return;
    try {
      const response = await fetch(body.dataset.rowsUrl, { headers: { "Accept": "text/html" } });
      if (!response.ok) return;
      body.innerHTML = await response.text();
      const shown = document.getElementById("pager-shown");
      if (shown && response.headers.get("X-Lousho-Shown")) shown.textContent = response.headers.get("X-Lousho-Shown");
    } catch (e) { /* the next poll tries again */ }
  }
  async function refreshCount(badge) {
    try {
      const response = await fetch(badge.dataset.countUrl, { headers: { "Accept": "application/json" } });
      if (!response.ok) return;
      badge.textContent = String((await response.json()).pending);
    } catch (e) { /* the next poll tries again */ }
  }
  setInterval(function () {
    document.querySelectorAll("tbody.live-rows").forEach(refreshRows);
    const badge = document.getElementById("pending-count");
    if (badge) refreshCount(badge);
  }, 2000);
})();
