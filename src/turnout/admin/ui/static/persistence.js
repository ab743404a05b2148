// The Persistence page: restore a backup ZIP (after a confirmation) through POST /admin/api/backup/restore.
// The API checks the whole ZIP before it replaces anything; this script only sends it and shows the answer.
(function () {
  "use strict";
  function el(id) { return document.getElementById(id); }

  function line(list, text) {
    var li = document.createElement("li");
    li.textContent = text;
    list.appendChild(li);
  }

  async function restore() {
    var form = el("restore-form");
    var d = form.dataset;
    var fmt = turnout.forms.fmt;
    var file = el("restore-file").files[0];
    el("restore-dialog").close();
    var summary = el("restore-summary");
    var details = el("restore-details");
    details.textContent = "";
    el("restore-result").hidden = false;
    summary.className = "";
    summary.textContent = d.msgRunning;
    el("restore-start").disabled = true;
    var data = new FormData();
    data.append("backup", file, file.name);
    try {
      var response = await fetch("/admin/api/backup/restore", {
        method: "POST",
        headers: { "X-CSRF-Token": turnout.csrf(), "Accept": "application/json" },
        body: data,
        credentials: "same-origin",
      });
      var body = null;
      try { body = await response.json(); } catch (e) { body = null; }
      if (!response.ok) {
        var err = (body && body.error) || {};
        summary.className = "error";
        summary.textContent = fmt(d.msgFailed, { message: err.message || response.statusText });
        return;
      }
      summary.className = "ok";
      summary.textContent = fmt(d.msgDone, { created: body.manifest.created_at || "", version: body.manifest.turnout_version || "" });
      line(details, fmt(d.msgFiles, { files: (body.restored || []).join(", ") }));
      if (body.restart_required) {
        line(details, d.msgRestart);
        (body.restart_reasons || []).forEach(function (reason) { line(details, reason); });
      }
      (body.warnings || []).forEach(function (warning) { line(details, warning); });
      turnout.toast(summary.textContent);
    } catch (err) {
      summary.className = "error";
      summary.textContent = fmt(d.msgFailed, { message: err.message });
    } finally {
      el("restore-start").disabled = false;
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = el("restore-form");
    if (!form) return;
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      turnout.forms.clearErrors(form);
      var file = el("restore-file").files[0];
      if (!file) {
        turnout.forms.showError(form, "backup", form.dataset.msgPick);
        return;
      }
      var text = el("restore-confirm-text");
      text.textContent = turnout.forms.fmt(text.dataset.template, { file: file.name });
      el("restore-dialog").showModal();
      el("restore-cancel").focus();
    });
    el("restore-confirm").addEventListener("click", restore);
    el("restore-cancel").addEventListener("click", function () { el("restore-dialog").close(); });
  });
})();
