// The Model aliases page: add or change an alias (PUT /admin/api/aliases/{name}; a change carries the row's
// If-Match), remove a runtime one (DELETE with If-Match). Every check is the JSON API's: a 422 is shown next to
// its field, a 412 (changed meanwhile) says so and reloads the list. Messages come from data-* attributes.
(function () {
  "use strict";
  var fmt;

  function el(id) { return document.getElementById(id); }
  function refreshList() { if (window.htmx) htmx.trigger(document.body, "aliases-changed"); }
  function path(name) { return "/admin/api/aliases/" + encodeURIComponent(name).replace(/%2F/g, "/"); }

  function failed(form, err) {
    if (err.status === 412 && form.dataset.msgStale) {
      turnout.forms.showError(form, "", form.dataset.msgStale);
      refreshList();
      return;
    }
    turnout.forms.showError(form, err.field, err.message);
  }

  function stopEditing() {
    var form = el("alias-form");
    delete form.dataset.etag;
    delete form.dataset.editing;
    el("a-name").readOnly = false;
    el("a-clear").hidden = true;
    el("a-editing").hidden = true;
  }

  function startEdit(button) {
    var form = el("alias-form");
    turnout.forms.clearErrors(form);
    form.dataset.etag = button.dataset.etag;
    form.dataset.editing = button.dataset.name;
    el("a-name").value = button.dataset.name;
    el("a-name").readOnly = true;
    el("a-model").value = button.dataset.model;
    el("a-clear").hidden = false;
    var note = el("a-editing");
    note.textContent = fmt(note.dataset.template, { name: button.dataset.name });
    note.hidden = false;
    el("a-model").focus();
    el("a-model").select();
  }

  async function save(event) {
    event.preventDefault();
    var form = event.target;
    turnout.forms.clearErrors(form);
    var name = el("a-name").value.trim();
    var model = el("a-model").value.trim();
    if (name === "") { turnout.forms.showError(form, "name", form.dataset.msgNameRequired); return; }
    var opts = form.dataset.editing === name && form.dataset.etag ? { etag: form.dataset.etag } : undefined;
    el("a-save").disabled = true;
    try {
      var r = await turnout.api("PUT", path(name), { model: model }, opts);
      var message = r.status === 201 ? form.dataset.msgAdded : form.dataset.msgChanged;
      turnout.toast(fmt(message, { name: r.body.alias.name, model: r.body.alias.model }));
      form.reset();
      stopEditing();
      refreshList();
    } catch (err) {
      failed(form, err);
    } finally {
      el("a-save").disabled = false;
    }
  }

  function startRemove(button) {
    var dialog = el("remove-dialog");
    dialog.dataset.name = button.dataset.name;
    dialog.dataset.etag = button.dataset.etag;
    var form = dialog.querySelector("form");
    turnout.forms.clearErrors(form);
    var what = el("remove-what");
    what.textContent = fmt(what.dataset.template, { name: button.dataset.name });
    dialog.showModal();
    dialog.querySelector("[data-close]").focus();
  }

  async function remove(event) {
    event.preventDefault();
    var form = event.target;
    var dialog = el("remove-dialog");
    try {
      var r = await turnout.api("DELETE", path(dialog.dataset.name), undefined, { etag: dialog.dataset.etag });
      dialog.close();
      var restored = r.body.alias;
      turnout.toast(restored
        ? fmt(form.dataset.msgRestored, { name: r.body.removed, model: restored.model })
        : fmt(form.dataset.msgRemoved, { name: r.body.removed }));
      refreshList();
    } catch (err) {
      failed(form, err);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = el("alias-form");
    if (!form) return;
    fmt = turnout.forms.fmt;
    form.addEventListener("submit", save);
    el("a-clear").addEventListener("click", function () {
      form.reset();
      turnout.forms.clearErrors(form);
      stopEditing();
      el("a-name").focus();
    });
    el("remove-form").addEventListener("submit", remove);
    document.querySelectorAll("dialog [data-close]").forEach(function (button) {
      button.addEventListener("click", function () { button.closest("dialog").close(); });
    });
    document.addEventListener("click", function (event) {
      var button = event.target.closest("button[data-action]");
      if (!button || !button.closest("#models-list")) return;
      if (button.dataset.action === "edit") startEdit(button);
      else if (button.dataset.action === "remove") startRemove(button);
    });
  });
})();
