// The Endpoints page: Add / Edit form with "Test connection" (a dry run through the JSON API, nothing saved),
// Save, Re-check and Remove. Every rule (validation, which field a failed check is about, whether a URL is
// private) is the API's: this script only shows its answers. Messages come from data-* attributes.
(function () {
  "use strict";
  var form, msg, fmt;

  function el(id) { return document.getElementById(id); }
  function refreshList() { if (window.htmx) htmx.trigger(document.body, "endpoints-changed"); }
  function editing() { return el("ep-mode").value === "edit"; }

  function budgetValue() {
    var raw = el("ep-budget").value.trim();
    if (raw === "") return null;
    return /^[0-9]+$/.test(raw) ? Number(raw) : raw;  // anything else: the API says what is wrong with it
  }

  function clearResult() {
    el("ep-result").hidden = true;
    el("ep-result-summary").textContent = "";
    el("ep-result-summary").className = "";  // "Testing…" is no result: not shown as the last one's ok or error
    el("ep-result-models").textContent = "";
    el("ep-url-warning").textContent = "";
  }

  function showTest(test, extra) {
    var section = el("ep-result");
    var summary = el("ep-result-summary");
    var list = el("ep-result-models");
    list.textContent = "";
    section.hidden = false;
    section.dataset.ok = test.ok ? "yes" : "no";
    if (test.ok) {
      summary.className = "ok";
      summary.textContent = fmt(msg.ok, { latency: Math.round(test.latency_ms), count: test.models.length }) +
        " " + (test.models.length ? msg.models : msg.noModels);
      test.models.forEach(function (name) {
        var li = document.createElement("li");
        li.textContent = name;
        list.appendChild(li);
      });
    } else {
      summary.className = "error";
      summary.textContent = fmt(msg.failed, { error: test.error || test.failure || "" });
      if (test.hint) turnout.forms.showError(form, test.field || "url", test.hint);
    }
    if (extra && extra.url_private === true && extra.private_networks_allowed === false) {
      el("ep-url-warning").textContent = msg.privateWarning;
    }
  }

  // The API dropped an API suffix from the URL (http://host:1234/v1 -> http://host:1234): show the URL it
  // uses in the field, and say so under it.
  function trimmedUrl(body) {
    if (!body.url_note || !body.url) return;
    el("ep-url").value = body.url;
    var warning = el("ep-url-warning");
    var note = fmt(msg.urlTrimmed, { url: body.url });
    warning.textContent = warning.textContent ? note + " " + warning.textContent : note;
  }

  function fail(err) {
    var field = err.field;
    if (!field && err.code === "endpoint_exists") field = "name";
    if (err.status === 412) {
      turnout.forms.showError(form, "", msg.stale);
      refreshList();
      return;
    }
    turnout.forms.showError(form, field, err.message);
  }

  async function runTest() {
    turnout.forms.clearErrors(form);
    clearResult();
    var button = el("ep-test");
    button.disabled = true;
    el("ep-result-summary").textContent = msg.testing;
    el("ep-result").hidden = false;
    try {
      var name = el("ep-name").value.trim();
      var url = el("ep-url").value.trim();
      var api = el("ep-api").value;
      var credential = el("ep-credential").value;
      var variable = el("ep-credential-env").value.trim();
      var stored = form.dataset.storedUrl === url && form.dataset.storedApi === api;
      var r;
      if (editing() && stored && credential === "" && variable === "" && !el("ep-clear-credential").checked) {
        // the saved endpoint as it is (with its stored credential): the API's re-check
        r = await turnout.api("POST", "/admin/api/endpoints/" + encodeURIComponent(name) + "/test");
        showTest(r.body.test || { ok: false, error: r.body.endpoint.last_error }, r.body.endpoint);
        refreshList();
        return;
      }
      var body = { url: url, api: api };
      if (credential !== "") body.credential = credential;
      if (variable !== "") body.credential_env = variable;
      if (!editing() && name !== "") body.name = name;
      var fallback = el("ep-fallback").value.trim();
      if (fallback !== "") body.fallback_model = fallback;
      var budget = budgetValue();
      if (budget !== null) body.latency_budget_ms = budget;
      r = await turnout.api("POST", "/admin/api/endpoints/test", body);
      showTest(r.body.test, r.body);
      trimmedUrl(r.body);
      if (editing() && credential === "" && form.dataset.storedCredential === "yes") {
        el("ep-result-summary").textContent += " " + msg.keepCredential;
      }
      if (r.body.name_taken) turnout.forms.showError(form, "name", msg.nameTaken);
    } catch (err) {
      clearResult();
      fail(err);
    } finally {
      button.disabled = false;
    }
  }

  async function save(event) {
    event.preventDefault();
    turnout.forms.clearErrors(form);
    var name = el("ep-name").value.trim();
    var credential = el("ep-credential").value;
    var variable = el("ep-credential-env").value.trim();
    var fallback = el("ep-fallback").value.trim();
    var budget = budgetValue();
    var button = el("ep-save");
    button.disabled = true;
    try {
      if (editing()) {
        var changes = { url: el("ep-url").value.trim(), api: el("ep-api").value,
          fallback_model: fallback === "" ? null : fallback, latency_budget_ms: budget };
        if (el("ep-clear-credential").checked) changes.credential = null;
        else if (credential !== "") changes.credential = credential;
        if (variable !== "") changes.credential_env = variable;
        var changed = await turnout.api("PATCH", "/admin/api/endpoints/" + encodeURIComponent(name), changes,
          { etag: el("ep-etag").value });
        turnout.toast(fmt(msg.saved, { name: name }) +
          (changed.body.url_note ? " " + fmt(msg.urlTrimmed, { url: changed.body.endpoint.url }) : ""));
        resetForm();
      } else {
        var body = { name: name, url: el("ep-url").value.trim(), api: el("ep-api").value };
        if (credential !== "") body.credential = credential;
        if (variable !== "") body.credential_env = variable;
        if (fallback !== "") body.fallback_model = fallback;
        if (budget !== null) body.latency_budget_ms = budget;
        var r = await turnout.api("POST", "/admin/api/endpoints", body);
        resetForm();
        if (r.body.test) showTest(r.body.test, r.body.endpoint);
        if (r.body.url_note) turnout.toast(fmt(msg.urlTrimmed, { url: r.body.endpoint.url }));
        turnout.secret.show(r.body.key, fmt(msg.added, { name: name, prefix: r.body.key_prefix }));
      }
      refreshList();
    } catch (err) {
      fail(err);
    } finally {
      button.disabled = false;
    }
  }

  function resetForm() {
    form.reset();
    turnout.forms.clearErrors(form);
    el("ep-mode").value = "add";
    el("ep-etag").value = "";
    el("ep-name").readOnly = false;
    el("ep-cancel").hidden = true;
    el("ep-clear-credential-row").hidden = true;
    delete form.dataset.storedUrl;
    delete form.dataset.storedApi;
    delete form.dataset.storedCredential;
    var title = el("ep-form-title");
    title.textContent = title.dataset.add;
  }

  function startEdit(button) {
    resetForm();
    clearResult();
    var d = button.dataset;
    el("ep-mode").value = "edit";
    el("ep-etag").value = d.etag;
    el("ep-name").value = d.name;
    el("ep-name").readOnly = true;  // an endpoint is never renamed
    el("ep-url").value = d.url;
    el("ep-api").value = d.api;
    el("ep-fallback").value = d.fallback;
    el("ep-budget").value = d.budget;
    form.dataset.storedUrl = d.url;
    form.dataset.storedApi = d.api;
    form.dataset.storedCredential = d.credential;
    el("ep-clear-credential-row").hidden = d.credential !== "yes";
    el("ep-cancel").hidden = false;
    var title = el("ep-form-title");
    title.textContent = fmt(title.dataset.edit, { name: d.name });
    el("ep-url").focus();
  }

  async function recheck(button) {
    button.disabled = true;
    try {
      var r = await turnout.api("POST", "/admin/api/endpoints/" + encodeURIComponent(button.dataset.name) + "/test");
      var test = r.body.test;
      turnout.toast(test && test.ok ? fmt(msg.ok, { latency: Math.round(test.latency_ms), count: test.models.length })
        : fmt(msg.failed, { error: (test && (test.hint || test.error)) || "" }), !(test && test.ok));
      refreshList();
    } catch (err) {
      turnout.toast(err.message, true);
    } finally {
      button.disabled = false;
    }
  }

  function askRemove(button) {
    var dialog = el("remove-dialog");
    dialog.dataset.name = button.dataset.name;
    dialog.dataset.etag = button.dataset.etag;
    var what = el("remove-what");
    what.textContent = fmt(what.dataset.template, { name: button.dataset.name });
    el("remove-keep-keys").checked = false;
    dialog.showModal();
    el("remove-cancel").focus();
  }

  async function remove() {
    var dialog = el("remove-dialog");
    var name = dialog.dataset.name;
    var keep = el("remove-keep-keys").checked;
    var done = el("remove-form").dataset;
    try {
      var r = await turnout.api("DELETE", "/admin/api/endpoints/" + encodeURIComponent(name) +
        "?keep_keys=" + (keep ? "true" : "false"), undefined, { etag: dialog.dataset.etag });
      var revoked = r.body.revoked_keys || [];
      turnout.toast(revoked.length ? fmt(done.msgRevoked, { name: name, keys: revoked.join(", ") })
        : fmt(done.msgRemoved, { name: name }));
      if (editing() && el("ep-name").value === name) resetForm();
    } catch (err) {
      turnout.toast(err.status === 412 ? msg.stale : err.message, true);
    } finally {
      dialog.close();
      refreshList();
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    form = el("endpoint-form");
    if (!form) return;
    fmt = turnout.forms.fmt;
    var d = form.dataset;
    msg = { ok: d.msgOk, failed: d.msgFailed, models: d.msgModels, noModels: d.msgNoModels,
      privateWarning: d.msgPrivate, nameTaken: d.msgNameTaken, saved: d.msgSaved, added: d.msgAdded,
      stale: d.msgStale, testing: d.msgTesting, keepCredential: d.msgKeepCredential, urlTrimmed: d.msgUrlTrimmed };
    form.addEventListener("submit", save);
    el("ep-test").addEventListener("click", runTest);
    el("ep-recheck").addEventListener("click", runTest);
    el("ep-cancel").addEventListener("click", function () { resetForm(); clearResult(); });
    el("remove-confirm").addEventListener("click", remove);
    el("remove-cancel").addEventListener("click", function () { el("remove-dialog").close(); });
    document.addEventListener("click", function (event) {
      var button = event.target.closest("button[data-action]");
      if (!button || !button.closest("#endpoints-list")) return;
      if (button.dataset.action === "edit") startEdit(button);
      else if (button.dataset.action === "recheck") recheck(button);
      else if (button.dataset.action === "remove") askRemove(button);
    });
  });
})();
