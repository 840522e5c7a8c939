// bucketq console: the live tail of the logs page and the refresh of the figures.
// No framework; the pages work without it (search, paging, actions are plain forms).
"use strict";

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function startTail() {
  const table = document.getElementById("logs");
  const toggle = document.getElementById("tail-toggle");
  const status = document.getElementById("tail-status");
  if (!table || !toggle) return;
  const body = table.tBodies[0];
  const seen = new Set([...body.querySelectorAll("tr[data-id]")].map((r) => r.dataset.id));
  let since = table.dataset.since;
  let timer = null;
  const form = document.getElementById("log-filters");

  async function poll() {
    const params = new URLSearchParams(new FormData(form));
    params.delete("from");
    params.delete("to");
    params.set("since", since);
    try {
      const res = await fetch(table.dataset.tailUrl + "?" + params, { credentials: "same-origin" });
      if (!res.ok) throw new Error("HTTP " + res.status);
      const data = await res.json();
      since = data.since;
      const fresh = data.logs.filter((r) => !seen.has(r.id)).reverse();  // oldest first
      for (const r of fresh) {
        seen.add(r.id);
        const tr = el("tr", { "data-id": r.id, class: "new lvl-" + r.level });
        const a = el("a", { href: table.dataset.detail + encodeURIComponent(r.id) + (table.dataset.detailQuery || "") }, r.time_text);
        const td = el("td", { class: "time" });
        td.appendChild(a);
        tr.appendChild(td);
        const lv = el("td");
        lv.appendChild(el("span", { class: "level" }, r.level));
        tr.appendChild(lv);
        tr.appendChild(el("td", {}, r.service));
        const msg = el("td", { class: "msg" }, r.message);
        if (r.cut) {  // the server cut it: the record's page has the whole message
          msg.appendChild(el("a", { class: "more", href: table.dataset.detail + encodeURIComponent(r.id) },
                             "… " + r.message_chars.toLocaleString("en") + " characters"));
        }
        tr.appendChild(msg);
        const trace = el("td", { class: "trace" });
        if (r.trace_id) {
          trace.appendChild(el("a", { href: table.dataset.trace + encodeURIComponent(r.trace_id) + (table.dataset.detailQuery || ""),
                                      title: r.trace_id }, r.trace_id.length > 12 ? r.trace_id.slice(0, 11) + "…" : r.trace_id));
        }
        tr.appendChild(trace);
        const empty = body.querySelector("tr.empty");
        if (empty) empty.remove();
        body.insertBefore(tr, body.firstChild);
      }
      while (body.rows.length > 500) body.deleteRow(body.rows.length - 1);
      status.textContent = "Live: checked " + new Date().toLocaleTimeString() + (fresh.length ? ", " + fresh.length + " new" : "");
    } catch (err) {
      status.textContent = "Live tail: " + err.message + "; retrying";
    }
  }

  toggle.addEventListener("change", () => {
    status.hidden = !toggle.checked;
    if (toggle.checked) {
      poll();
      timer = setInterval(poll, 500);
    } else if (timer) {
      clearInterval(timer);
      timer = null;
    }
  });
}

function sparkPoints(vals, w, h) {
  if (vals.length < 2) return "";
  const lo = Math.min(...vals), hi = Math.max(...vals), span = (hi - lo) || 1, step = w / (vals.length - 1);
  return vals.map((v, i) => (i * step).toFixed(1) + "," + (h - 2 - (v - lo) / span * (h - 4)).toFixed(1)).join(" ");
}

function refreshQueues() {
  const table = document.getElementById("queues");
  if (!table) return;
  setInterval(async () => {
    try {
      const res = await fetch(table.dataset.url, { credentials: "same-origin" });
      if (!res.ok) return;
      const data = await res.json();
      // A queue made or dropped since the page was drawn: draw it again (the rows are
      // the server's template; a sample older than the page may have drawn it).
      const shown = [...table.querySelectorAll("tr[data-name]")].map(tr => tr.dataset.name);
      const now = data.queues.map(q => q.name);
      if (shown.length !== now.length || now.some(n => !shown.includes(n))) {
        location.reload();
        return;
      }
      for (const q of data.queues) {
        const tr = table.querySelector('tr[data-name="' + CSS.escape(q.name) + '"]');
        if (!tr) continue;
        for (const td of tr.querySelectorAll("td[data-k]")) {
          const k = td.dataset.k;
          if (k === "rate") td.textContent = (q.rate.total >= 0 ? "+" : "") + q.rate.total.toFixed(1) + "/s";
          else if (k === "oldest_ready_s") td.textContent = q[k] === null ? "-" : q[k].toFixed(1) + " s";
          else td.textContent = q[k] === null ? "-" : q[k];
        }
        const pl = tr.querySelector("svg.spark polyline");
        if (pl) pl.setAttribute("points", q.spark);
      }
    } catch (err) { /* the next refresh tries again */ }
  }, 2000);
}

function refreshIngest() {
  const box = document.getElementById("ingest");
  if (!box) return;
  const hist = { requests: [], records: [] };
  let last = null;
  async function tick() {
    try {
      const res = await fetch(box.dataset.url, { credentials: "same-origin" });
      if (!res.ok) return;
      const s = await res.json();
      if (last) {
        const dt = s.at - last.at;
        for (const k of ["requests", "records"]) {
          if (s[k] === undefined) continue;
          const rate = Math.max(0, (s[k] - last[k]) / dt);
          hist[k].push(rate);
          if (hist[k].length > 60) hist[k].shift();
          document.getElementById("rate-" + k).textContent = rate.toFixed(1);
          document.getElementById("spark-" + k).setAttribute("points", sparkPoints(hist[k], 120, 28));
        }
      }
      const dlq = document.getElementById("dlq-size");
      if (dlq && s.dlq !== undefined && s.dlq !== null) dlq.textContent = s.dlq;
      last = s;
    } catch (err) { /* the next refresh tries again */ }
  }
  tick();
  setInterval(tick, 2000);
}

document.addEventListener("DOMContentLoaded", () => {
  startTail();
  refreshQueues();
  refreshIngest();
});
