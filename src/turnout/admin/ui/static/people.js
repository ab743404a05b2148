// The Account page (make a personal token, shown once; revoke one) and the People page (an admin disables or
// enables a person, revokes a token). Every change is a JSON API call; the page reloads after it.
(function () {
  "use strict";
  function fieldError(name, message) {
    var box = document.getElementById("token-" + name + "-error");
    var input = document.getElementById("token-" + name);
    if (box) box.textContent = message || "";
    if (input) { if (message) input.setAttribute("aria-invalid", "true"); else input.removeAttribute("aria-invalid"); }
  }

  document.addEventListener("submit", async function (event) {
    var form = event.target.closest("#token-form");
    if (!form) return;
    event.preventDefault();
    ["name", "days", "role"].forEach(function (n) { fieldError(n, ""); });
    var body = { name: form.name.value.trim(), days: parseInt(form.days.value, 10), role: form.role.value || null };
    try {
      var r = await turnout.api("POST", "/admin/api/me/tokens", body);
      form.reset();
      turnout.secret.show(r.body.token, form.dataset.created.replace("{name}", r.body.record.name));
    } catch (err) {
      if (err.field && document.getElementById("token-" + err.field)) fieldError(err.field, err.message);
      else turnout.toast(err.message, true);
    }
  });

  document.addEventListener("click", async function (event) {
    var button = event.target.closest("button.revoke-token, button.person-state");
    if (!button) return;
    if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
    button.disabled = true;
    try {
      await turnout.api("POST", button.dataset.url);
      location.reload();
    } catch (err) {
      button.disabled = false;
      turnout.toast(err.message, true);
    }
  });
  document.addEventListener("click", function (event) {
    if (event.target.closest("#secret-done")) location.reload();
  });
})();
