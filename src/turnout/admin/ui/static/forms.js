// Form helpers shared by the Endpoints and Keys pages: an API error shown next to the field it is about.
// turnout.forms.showError(form, field, text): the text goes into [data-error-for=<field>] of the form (the
// field's input is marked aria-invalid; its aria-describedby already names that element); a field the form
// does not have (or none) goes to [data-error-for=""]. "models[2]" and "limits.rpm" are shown at "models" and
// "limits". clearErrors(form) undoes it. fmt("{count} models", {count: 2}) fills a catalog template.
(function () {
  "use strict";
  function base(field) {
    return String(field || "").split(/[.[]/)[0];
  }

  function clearErrors(form) {
    form.querySelectorAll("[data-error-for]").forEach(function (el) { el.textContent = ""; });
    form.querySelectorAll("[aria-invalid]").forEach(function (el) { el.removeAttribute("aria-invalid"); });
  }

  function showError(form, field, text) {
    var name = base(field);
    var slot = name ? form.querySelector('[data-error-for="' + name + '"]') : null;
    if (!slot) slot = form.querySelector('[data-error-for=""]');
    if (slot) slot.textContent = text;
    var input = name ? form.elements[name] : null;
    if (input && input.setAttribute) {
      input.setAttribute("aria-invalid", "true");
      input.focus();
    }
  }

  function fmt(template, fields) {
    return String(template || "").replace(/\{(\w+)\}/g, function (whole, key) {
      return fields && fields[key] !== undefined && fields[key] !== null ? String(fields[key]) : whole;
    });
  }

  window.turnout.forms = { clearErrors: clearErrors, showError: showError, fmt: fmt };
})();
