// venturi dashboard: refresh the parts of the page marked data-live, without reloading it.
// Every few seconds (the body's data-refresh), fetch this page again and swap in the new
// content of each [data-live] element, by id. Paused while the tab is hidden. No dependency.
(() => {
  "use strict";
  const period = Math.max(0.2, Number(document.body.dataset.refresh) || 5) * 1000;
  const badge = document.getElementById("live");
  let busy = false;

  function show(state, text) {
    if (!badge) return;
    badge.dataset.state = state;
    badge.textContent = text;
  }

  async function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    try {
      const response = await fetch(window.location.href, {
        headers: { "X-Venturi-Live": "1" },
        credentials: "same-origin",
        cache: "no-store",
      });
      if (!response.ok) throw new Error(String(response.status));
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      for (const element of document.querySelectorAll("[data-live][id]")) {
        const next = fresh.getElementById(element.id);
        // Leave a part alone while the user is in it (a form field being used) or over it
        // (rows must not move under a pointer about to click Forget).
        const inUse = element.contains(document.activeElement) || element.matches(":hover");
        if (next && next.innerHTML !== element.innerHTML && !inUse) {
          element.innerHTML = next.innerHTML;
        }
      }
      show("ok", "live");
      document.dispatchEvent(new CustomEvent("venturi:refreshed"));
    } catch (error) {
      show("lost", "offline, retrying");
    } finally {
      busy = false;
    }
  }

  // Actions that delete or change many jobs ask first (their forms carry data-confirm).
  document.addEventListener("submit", (event) => {
    const message = event.target instanceof HTMLFormElement ? event.target.dataset.confirm : null;
    if (message && !window.confirm(message)) event.preventDefault();
  }, true);

  setInterval(refresh, period);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
})();
