// Turnout admin UI: the shared script of every page (no inline script: the CSP forbids it).
// - sends the session's CSRF token with every htmx request (X-CSRF-Token)
// - turnout.api(method, path, body, {etag}): a JSON call to /admin/api with the session cookie and the token;
//   resolves {status, etag, body}; rejects with an Error carrying .status, .code, .field and .body
// - turnout.toast(text, isError): one polite live-region message
// - a click on an element with data-href (outside its links and buttons) opens that page
(function () {
  "use strict";
  function csrf() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  async function api(method, path, body, opts) {
    var headers = { "X-CSRF-Token": csrf(), "Accept": "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (opts && opts.etag) headers["If-Match"] = opts.etag;
    var response = await fetch(path, {
      method: method,
      headers: headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
    });
    var data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (!response.ok) {
      var err = (data && data.error) || {};
      var failure = new Error(err.message || response.statusText || String(response.status));
      failure.status = response.status;
      failure.code = err.code;
      failure.field = err.field;
      failure.body = data;
      throw failure;
    }
    return { status: response.status, etag: response.headers.get("ETag"), body: data };
  }

  var toastTimer = null;
  function toast(text, isError) {
    var box = document.getElementById("toast");
    if (!box) return;
    box.textContent = text;
    box.className = isError ? "show error" : "show";
    clearTimeout(toastTimer);
    toastTimer = setTimeout(function () { box.className = ""; }, isError ? 8000 : 3000);
  }

  document.addEventListener("htmx:configRequest", function (event) {
    event.detail.headers["X-CSRF-Token"] = csrf();
  });

  // A row or card with data-href (the Overview's workers) opens that page when clicked anywhere, as its link
  // does; not when the click was on a link or button of its own, or ended a text selection.
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("[data-href]");
    if (!row || event.defaultPrevented || event.button !== 0 || event.target.closest("a, button, input, select")) return;
    if (String(window.getSelection ? window.getSelection() : "") !== "") return;
    window.location.assign(row.dataset.href);
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.documentElement.classList.add("js");
  });

  window.turnout = { api: api, toast: toast, csrf: csrf };
})();
