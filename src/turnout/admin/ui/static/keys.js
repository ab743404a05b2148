// The Keys page: create (the key shown once), edit scopes, limits and class, rotate with a grace period, revoke.
// Every check is the JSON API's; a 422 is shown next to its field, a 412 (changed meanwhile) says so and
// reloads the list. Messages come from data-* attributes.
(function () {
  "use strict";
  var fmt;

  function el(id) { return document.getElementById(id); }
  function refreshList() { if (window.htmx) htmx.trigger(document.body, "keys-changed"); }

  function lines(text) {
    return text.split(/[\n,]/).map(function (s) { return s.trim(); }).filter(function (s) { return s !== ""; });
  }

  function count(value) {  // digits become a number; anything else goes as typed, for the API to judge
    var raw = value.trim();
    if (raw === "") return null;
    return /^[0-9]+$/.test(raw) ? Number(raw) : raw;
  }

  function failed(form, err) {
    if (err.status === 412 && form.dataset.msgStale) {
      turnout.forms.showError(form, "", form.dataset.msgStale);
      refreshList();
      return;
    }
    turnout.forms.showError(form, err.field, err.message);
  }

  async function create(event) {
    event.preventDefault();
    var form = event.target;
    turnout.forms.clearErrors(form);
    var body = { app: el("k-app").value.trim() };
    var tenant = el("k-tenant").value.trim();
    if (tenant !== "") body.tenant = tenant;
    var models = lines(el("k-models").value);
    if (models.length) body.models = models;
    var rpm = count(el("k-rpm").value);
    if (rpm !== null) body.rpm = rpm;
    var daily = count(el("k-daily").value);
    if (daily !== null) body.daily_tokens = daily;
    var expires = el("k-expires").value.trim();
    if (expires !== "") body.expires = expires;
    var priority = el("k-priority").value;
    if (priority !== "") body.priority = priority;
    el("k-create").disabled = true;
    try {
      var r = await turnout.api("POST", "/admin/api/keys", body);
      form.reset();
      turnout.secret.show(r.body.key, fmt(form.dataset.msgCreated, { app: r.body.record.app, prefix: r.body.record.prefix }));
      refreshList();
    } catch (err) {
      failed(form, err);
    } finally {
      el("k-create").disabled = false;
    }
  }

  function open(dialogId, button) {
    var dialog = el(dialogId);
    dialog.dataset.id = button.dataset.id;
    dialog.dataset.prefix = button.dataset.prefix;
    dialog.dataset.etag = button.dataset.etag;
    var form = dialog.querySelector("form");
    turnout.forms.clearErrors(form);
    dialog.querySelectorAll("[data-template]").forEach(function (node) {
      node.textContent = fmt(node.dataset.template, { prefix: button.dataset.prefix });
    });
    return dialog;
  }

  function startEdit(button) {
    var dialog = open("edit-dialog", button);
    el("e-models").value = button.dataset.models;
    el("e-rpm").value = button.dataset.rpm;
    el("e-daily").value = button.dataset.daily;
    el("e-expires").value = button.dataset.expires;
    el("e-priority").value = button.dataset.priority;
    dialog.showModal();
    el("e-models").focus();
  }

  async function saveEdit(event) {
    event.preventDefault();
    var form = event.target;
    var dialog = el("edit-dialog");
    turnout.forms.clearErrors(form);
    var expires = el("e-expires").value.trim();
    var priority = el("e-priority").value;
    var body = { models: lines(el("e-models").value), rpm: count(el("e-rpm").value),
      daily_tokens: count(el("e-daily").value), expires: expires === "" ? null : expires,
      priority: priority === "" ? null : priority };
    try {
      await turnout.api("PATCH", "/admin/api/keys/" + dialog.dataset.id, body, { etag: dialog.dataset.etag });
      dialog.close();
      turnout.toast(fmt(form.dataset.msgSaved, { prefix: dialog.dataset.prefix }));
      refreshList();
    } catch (err) {
      failed(form, err);
    }
  }

  function startRotate(button) {
    var dialog = open("rotate-dialog", button);
    el("r-grace").value = el("r-grace").dataset.default;
    dialog.showModal();
    el("r-grace").focus();
  }

  async function rotate(event) {
    event.preventDefault();
    var form = event.target;
    var dialog = el("rotate-dialog");
    turnout.forms.clearErrors(form);
    var raw = el("r-grace").value.trim();
    var body = {};
    if (raw !== "") body.grace_s = /^[0-9]+(\.[0-9]+)?$/.test(raw) ? Number(raw) * 3600 : raw;
    try {
      var r = await turnout.api("POST", "/admin/api/keys/" + dialog.dataset.id + "/rotate", body,
        { etag: dialog.dataset.etag });
      dialog.close();
      var until = r.body.old.grace_until ? new Date(r.body.old.grace_until * 1000).toISOString().replace(".000", "") : "";
      turnout.secret.show(r.body.key, fmt(form.dataset.msgRotated,
        { prefix: r.body.record.prefix, old: r.body.old.prefix, until: until }));
      refreshList();
    } catch (err) {
      failed(form, err);
    }
  }

  function startRevoke(button) {
    var dialog = open("revoke-dialog", button);
    dialog.showModal();
    dialog.querySelector("[data-close]").focus();
  }

  async function revoke(event) {
    event.preventDefault();
    var form = event.target;
    var dialog = el("revoke-dialog");
    try {
      await turnout.api("POST", "/admin/api/keys/" + dialog.dataset.id + "/revoke", undefined,
        { etag: dialog.dataset.etag });
      dialog.close();
      turnout.toast(fmt(form.dataset.msgRevoked, { prefix: dialog.dataset.prefix }));
      refreshList();
    } catch (err) {
      failed(form, err);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var createForm = el("create-form");
    if (!createForm) return;
    fmt = turnout.forms.fmt;
    createForm.addEventListener("submit", create);
    el("edit-form").addEventListener("submit", saveEdit);
    el("rotate-form").addEventListener("submit", rotate);
    el("revoke-form").addEventListener("submit", revoke);
    document.querySelectorAll("dialog [data-close]").forEach(function (button) {
      button.addEventListener("click", function () { button.closest("dialog").close(); });
    });
    document.addEventListener("click", function (event) {
      var button = event.target.closest("button[data-action]");
      if (!button || !button.closest("#keys-list")) return;
      if (button.dataset.action === "edit") startEdit(button);
      else if (button.dataset.action === "rotate") startRotate(button);
      else if (button.dataset.action === "revoke") startRevoke(button);
    });
  });
})();
