// LonnyMQ dashboard: confirmations, select-all, and refreshing live pages in place.
"use strict";
document.addEventListener("click", (e) => {
  const el = e.target.closest("[data-confirm]");
  if (el && el.tagName === "BUTTON" && !window.confirm(el.dataset.confirm)) e.preventDefault();
});
document.addEventListener("submit", (e) => {
  const form = e.target;
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) e.preventDefault();
});
document.addEventListener("change", (e) => {
  if (e.target.matches("[data-autosubmit]")) { e.target.form.submit(); return; }
  const all = e.target.closest("[data-select-all]");
  if (!all) return;
  for (const box of document.querySelectorAll(`input[name="${all.dataset.selectAll}"]`)) box.checked = all.checked;
});
// Live pages (data-refresh="seconds") reload their content, unless the user is busy with a form;
// the flash of the last action stays.
(function refresh() {
  const main = document.getElementById("content");
  const every = main && Number(main.dataset.refresh);
  if (!every) return;
  // A button held down: swapping the content between the press and the release would lose
  // the click (its press and release would be on different elements).
  let pressed = false;
  for (const [type, down] of [["pointerdown", true], ["pointerup", false], ["pointercancel", false]]) {
    window.addEventListener(type, () => { pressed = down; }, true);
  }
  // A window losing the focus may never see the release: that ends the press too (blur does
  // not bubble: this is the window's own, not a field's).
  window.addEventListener("blur", () => { pressed = false; });
  // Busy: a button is held down, a field has the focus, holds what the user typed, or a box is
  // ticked. Asked again when the fresh page has come: the user may have started typing or
  // clicking while it was on its way (swapping then emptied the purge's confirm field between
  // typing and clicking).
  const busy = () => {
    if (pressed) return true;
    const active = document.activeElement;
    if (active && ["INPUT", "SELECT", "TEXTAREA"].includes(active.tagName)) return true;
    if (document.querySelector("input[type=checkbox]:checked")) return true;
    return [...main.querySelectorAll("input, textarea")].some(
      (f) => f.type !== "hidden" && f.type !== "checkbox" && f.value !== f.defaultValue);
  };
  setInterval(async () => {
    if (document.hidden || busy()) return;
    try {
      const r = await fetch(location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (!r.ok) return;
      const doc = new DOMParser().parseFromString(await r.text(), "text/html");
      const fresh = doc.getElementById("content");
      if (!fresh || busy()) return;
      // The flash of the last action stays until the user leaves the page: a refresh swaps
      // the content around it (the server gives it once, so the fresh page has none).
      const flash = main.querySelector(".flash");
      fresh.querySelector(".flash")?.remove();
      main.innerHTML = fresh.innerHTML;
      if (flash) main.prepend(flash);
    } catch (_) { /* the next tick tries again */ }
  }, every * 1000);
})();
