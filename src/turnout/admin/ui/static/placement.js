// Model Placement: the matrix (toggle a cell, keyboard grid, rule explanation on hover and focus) and the
// worker ruleset editor (save, only installed, block all, reset to config default, inline pattern checks).
// Every change is a JSON API call with the worker's ETag in If-Match; a 412 shows the "changed elsewhere"
// banner and changes nothing. Messages come from data-* attributes rendered from the message catalog.
(function () {
  "use strict";
  var enc = encodeURIComponent;

  function showStale(root, serverMessage) {
    var banner = document.getElementById("stale");
    if (!banner) return;
    banner.querySelector(".text").textContent = root.dataset.msgStale + " " + (serverMessage || "");
    banner.hidden = false;
    banner.querySelector(".reload").focus();
  }

  document.addEventListener("click", function (event) {
    if (event.target.closest("#stale .reload")) location.reload();
  });

  // -- the matrix ------------------------------------------------------------------------------
  function initMatrix(table) {
    var info = document.getElementById("cell-info");
    var heads = table.tHead.rows[0].cells;
    var body = table.tBodies[0];
    var first = body.rows.length ? body.rows[0].cells[1] : null;
    if (first) first.tabIndex = 0;
    var current = first;

    var explanations = document.querySelectorAll("#explanations li");
    // "<model> on <worker>: <state>. <why>": the cell names its explanation by index (data-e), or carries it
    // itself (data-state, data-why) once re-rendered after a toggle
    function describe(td) {
      var state, why;
      if (td.dataset.why !== undefined) { state = td.dataset.state; why = td.dataset.why; }
      else { var li = explanations[+td.dataset.e]; state = li.dataset.state; why = li.textContent; }
      var values = { model: td.parentNode.cells[0].dataset.model, worker: heads[td.cellIndex].dataset.worker, state: state };
      return table.dataset.cell.replace(/\{(model|worker|state)\}/g, function (_, k) { return values[k]; }) + " " + why;
    }
    function explain(td) {
      if (!td || td.tagName !== "TD") return;
      td.title = describe(td);  // the native tooltip, set when first needed
      info.textContent = td.title;
    }
    function focusCell(td) {
      if (!td) return;
      if (current) current.tabIndex = -1;
      td.tabIndex = 0;
      current = td;
      td.focus();
    }

    async function toggle(td) {
      if (td.dataset.busy || td.classList.contains("na")) return;  // never routed here: nothing to decide
      var head = heads[td.cellIndex];
      var worker = head.dataset.worker;
      var model = td.parentNode.cells[0].dataset.model;
      td.dataset.busy = "1";
      td.setAttribute("aria-busy", "true");
      try {
        var r = await turnout.api("POST", "/admin/api/placement/workers/" + enc(worker) + "/toggle",
          { model: model }, { etag: head.dataset.etag });
        head.dataset.etag = r.body.etag;
        var src = head.querySelector(".src");
        if (src && !src.classList.contains("override")) {
          src.className = "src override";
          src.textContent = table.dataset.sourceOverride;
        }
        var html = await (await fetch("/admin/placement/cell?worker=" + enc(worker) + "&model=" + enc(model),
          { credentials: "same-origin" })).text();
        var tpl = document.createElement("template");
        tpl.innerHTML = html.trim();
        var fresh = tpl.content.querySelector("td");
        td.className = fresh.className;
        td.dataset.state = fresh.dataset.state;
        td.dataset.why = fresh.dataset.why;
        delete td.dataset.e;
        td.dataset.mark = fresh.dataset.mark;
        td.replaceChildren.apply(td, Array.prototype.slice.call(fresh.childNodes));  // the drawn mark and its text
        explain(td);
        table.dispatchEvent(new CustomEvent("turnout:toggled", { detail: { worker: worker, model: model } }));
      } catch (err) {
        if (err.status === 412) showStale(table, err.message);
        else turnout.toast(err.message, true);
        table.dispatchEvent(new CustomEvent("turnout:toggled", { detail: { error: err.message } }));
      } finally {
        delete td.dataset.busy;
        td.removeAttribute("aria-busy");
      }
    }

    table.addEventListener("click", function (event) {
      var td = event.target.closest("td");
      if (!td || !table.contains(td)) return;
      focusCell(td);
      toggle(td);
    });
    table.addEventListener("mouseover", function (event) { explain(event.target.closest("td")); });
    table.addEventListener("focusin", function (event) { explain(event.target.closest("td")); });
    table.addEventListener("keydown", function (event) {
      var td = event.target.closest("td");
      if (!td) return;
      var row = td.parentNode.sectionRowIndex, col = td.cellIndex, rows = body.rows;
      var next = null;
      switch (event.key) {
        case "ArrowRight": next = rows[row].cells[col + 1]; break;
        case "ArrowLeft": next = col > 1 ? rows[row].cells[col - 1] : null; break;
        case "ArrowDown": next = rows[row + 1] ? rows[row + 1].cells[col] : null; break;
        case "ArrowUp": next = rows[row - 1] ? rows[row - 1].cells[col] : null; break;
        case "Home": next = rows[row].cells[1]; break;
        case "End": next = rows[row].cells[rows[row].cells.length - 1]; break;
        case "Enter": case " ": event.preventDefault(); toggle(td); return;
        default: return;
      }
      event.preventDefault();
      focusCell(next);
    });
  }

  // -- the ruleset editor ------------------------------------------------------------------------
  function editor() { return document.getElementById("editor"); }
  function lines(text) { return text.split("\n").map(function (s) { return s.trim(); }).filter(Boolean); }

  function fieldError(id, message) {
    var box = document.getElementById(id + "-error");
    var input = document.getElementById(id);
    if (box) box.textContent = message || "";
    if (input) {
      if (message) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
  }

  function clearErrors() {
    ["allowed_models", "denied_models", "only-installed"].forEach(function (id) { fieldError(id, ""); });
  }

  async function refresh(message) {
    var root = editor();
    var html = await (await fetch(root.dataset.url, { credentials: "same-origin" })).text();
    var tpl = document.createElement("template");
    tpl.innerHTML = html.trim();
    root.replaceWith(tpl.content.firstElementChild);
    if (message) turnout.toast(message);
    document.dispatchEvent(new CustomEvent("turnout:rules-saved"));
  }

  async function write(method, suffix, body, errorField) {
    var root = editor();
    clearErrors();
    try {
      await turnout.api(method, "/admin/api/placement/workers/" + enc(root.dataset.worker) + suffix, body,
        { etag: root.dataset.etag });
      await refresh(root.dataset.msgSaved);
    } catch (err) {
      if (err.status === 412) { showStale(root, err.message); return; }
      if (err.code === "inventory_stale") document.getElementById("only-installed-stale").hidden = false;
      var field = (err.field || "").split("[")[0];
      if (field === "allowed_models" || field === "denied_models") fieldError(field, err.message);
      else if (errorField) fieldError(errorField, err.message);
      else turnout.toast(err.message, true);
    }
  }

  var checkTimers = {};
  async function check(textarea) {
    var field = textarea.dataset.field;
    var answer;
    try {
      var r = await fetch("/admin/placement/check", {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": turnout.csrf() },
        body: JSON.stringify({ field: field, patterns: lines(textarea.value) }),
      });
      answer = await r.json();
    } catch (err) {
      return;  // the gateway did not answer (restarting, or the page is closing): no verdict as you type; Save checks
    }
    fieldError(field, answer.ok ? "" : answer.message);
  }

  document.addEventListener("input", function (event) {
    var textarea = event.target.closest("#editor textarea[data-field]");
    if (!textarea) return;
    clearTimeout(checkTimers[textarea.id]);
    checkTimers[textarea.id] = setTimeout(function () { check(textarea); }, 250);
  });

  document.addEventListener("submit", function (event) {
    if (event.target.id !== "rules-form") return;
    event.preventDefault();
    var form = event.target;
    var mode = form.querySelector("input[name=mode]:checked");
    write("PUT", "", {
      mode: mode ? mode.value : "allow_all",
      allowed_models: lines(form.allowed_models.value),
      denied_models: lines(form.denied_models.value),
    });
  });

  document.addEventListener("click", function (event) {
    var button = event.target.closest("#editor button");
    if (!button) return;
    if (button.id === "only-installed") write("POST", "/only-installed", {}, "only-installed");
    else if (button.id === "only-installed-stale") {
      write("POST", "/only-installed", { accept_stale: true }, "only-installed");  // the API's opt-in, said aloud
    }
    else if (button.id === "block-all") write("PUT", "", { mode: "whitelist", allowed_models: [], denied_models: [] });
    else if (button.id === "reset") document.getElementById("reset-dialog").showModal();
    else if (button.id === "reset-cancel") document.getElementById("reset-dialog").close();
    else if (button.id === "reset-confirm") {
      document.getElementById("reset-dialog").close();
      write("DELETE", "", undefined);
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    var table = document.getElementById("matrix");
    if (table) initMatrix(table);
  });
})();
