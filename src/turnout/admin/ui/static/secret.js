// Shows a secret (a new API key) once, with a copy button: turnout.secret.show(value, note).
// Used by the Endpoints and Keys pages (templates/_secret_reveal.html). The value lives only in the page:
// "Done" clears it, and the page itself is served no-store.
(function () {
  "use strict";
  function box() { return document.getElementById("secret-reveal"); }

  function show(value, note) {
    var section = box();
    if (!section) return;
    var input = document.getElementById("secret-value");
    input.value = value;
    document.getElementById("secret-note").textContent = note || "";
    section.hidden = false;
    section.focus();
    input.select();
  }

  function clear() {
    var section = box();
    if (!section) return;
    document.getElementById("secret-value").value = "";
    document.getElementById("secret-note").textContent = "";
    section.hidden = true;
  }

  async function copy() {
    var section = box();
    var input = document.getElementById("secret-value");
    try {
      await navigator.clipboard.writeText(input.value);
      turnout.toast(section.dataset.copied);
    } catch (err) {
      input.select();  // the browser refused (no clipboard permission): leave it selected for Ctrl+C
      turnout.toast(section.dataset.copyFailed, true);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var copyButton = document.getElementById("secret-copy");
    if (copyButton) copyButton.addEventListener("click", copy);
    var done = document.getElementById("secret-done");
    if (done) done.addEventListener("click", clear);
  });

  window.turnout.secret = { show: show, clear: clear };
})();
