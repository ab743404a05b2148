// The Batches page: cancel a batch that still runs (after a confirmation) through POST /admin/api/batches/{id}/cancel;
// the list (an htmx fragment) is reloaded after it. Messages come from data-* attributes.
(function () {
  "use strict";
  document.addEventListener("click", async function (event) {
    var button = event.target.closest("button[data-action='cancel']");
    if (!button) return;
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    button.disabled = true;
    try {
      await turnout.api("POST", button.dataset.url);
      if (window.htmx) htmx.trigger(document.body, "batches-changed");
    } catch (err) {
      button.disabled = false;
      turnout.toast(err.message, true);
    }
  });
})();
