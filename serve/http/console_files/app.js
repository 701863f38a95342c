"use strict";
// The console page: models and workers, traffic, try-it, chat, API docs.
// Tokens live in `tokens` below (this tab's memory) and nowhere else: not in storage, not in URLs.
(function () {
  const base = location.pathname.replace(/\/[^/]*$/, ""); // the console's path, e.g. /console
  const inferenceRoot = base + "/inference"; // the inference app, guarded as on its own port
  const metricsUrl = base + "/metrics";
  const tokens = { management: "", inference: "" };
  const $ = (selector) => document.querySelector(selector);
  const el = (tag, attrs = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    node.append(...children);
    return node;
  };
  const headers = (kind) => (tokens[kind] ? { authorization: "Bearer " + tokens[kind] } : {});
  const models = { described: [], generative: [] };

  function notice(text, kind = "ok") {
    const box = $("#notice");
    box.textContent = text;
    box.className = kind;
  }

  async function management(method, path) {
    const response = await fetch(path, { method, headers: headers("management") });
    const text = await response.text();
    let body = text;
    try { body = JSON.parse(text); } catch (_) { /* not JSON */ }
    return { ok: response.ok, status: response.status, body };
  }

  const message = (answer) => (answer.body && (answer.body.message || answer.body.status)) || JSON.stringify(answer.body);

  function confirmAction(text) {
    const dialog = $("#confirm");
    $("#confirm-text").textContent = text;
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    });
  }

  async function act(question, method, path) {
    if (!(await confirmAction(question))) return;
    const answer = await management(method, path);
    notice(`${answer.status}: ${message(answer)}`, answer.ok ? "ok" : "error");
    await refreshModels();
  }

  // ----- models ----------------------------------------------------------------------------------

  function isGenerative(described) {
    return described.generative === true || described.continuousBatching === true;
  }

  function workerLine(w, d) {
    const device = w.gpu ? `gpu ${w.gpuUsage}` : d.deviceType || "cpu";
    const mb = (w.memoryUsage / 1048576).toFixed(0);
    return el("span", { class: `worker ${w.status}`, text: `${w.id} ${w.status} pid ${w.pid} ${device} ${mb} MB` });
  }

  function versionRow(d, isDefault) {
    const path = `/models/${encodeURIComponent(d.modelName)}/${encodeURIComponent(d.modelVersion)}`;
    const scale = el("input", { type: "number", min: "0", value: String(d.minWorkers), class: "scale-input" });
    const scaleBtn = el("button", { class: "scale-btn", type: "button", text: "Scale" });
    scaleBtn.addEventListener("click", () => act(
      `Scale ${d.modelName} ${d.modelVersion} to ${scale.value} workers?`, "PUT",
      `${path}?min_worker=${encodeURIComponent(scale.value)}&synchronous=true`));
    const actions = el("td", { class: "actions" }, scale, scaleBtn);
    if (!isDefault) {
      const def = el("button", { class: "default-btn", type: "button", text: "Make default" });
      def.addEventListener("click", () => act(`Make ${d.modelVersion} the default of ${d.modelName}?`, "PUT", `${path}/set-default`));
      actions.append(def);
    }
    const drop = el("button", { class: "unregister-btn", type: "button", text: "Unregister" });
    drop.addEventListener("click", () => act(`Unregister ${d.modelName} ${d.modelVersion}?`, "DELETE", path));
    actions.append(drop);
    const queue = d.jobQueueStatus || {};
    return el("tr", { class: "version", "data-model": d.modelName, "data-version": d.modelVersion },
      el("td", { text: d.modelName }),
      el("td", { class: isDefault ? "default" : "", text: d.modelVersion + (isDefault ? " (default)" : "") }),
      el("td", { class: "workers" }, ...(d.workers || []).map((w) => workerLine(w, d))),
      el("td", { class: "num", text: `${d.batchSize} / ${d.maxBatchDelay} ms` }),
      el("td", { class: "num queue", text: `${queue.pendingRequests ?? "?"} waiting, ${queue.remainingCapacity ?? "?"} free` }),
      actions);
  }

  async function refreshModels() {
    const listed = await management("GET", "/models?limit=100");
    if (!listed.ok) { notice(`models: ${listed.status} ${message(listed)}`, "error"); return; }
    const rows = [];
    const described = [];
    for (const m of listed.body.models || []) {
      const name = encodeURIComponent(m.modelName);
      const [all, current] = await Promise.all([management("GET", `/models/${name}/all`), management("GET", `/models/${name}`)]);
      if (!all.ok || !current.ok) continue;
      const defaultVersion = current.body[0].modelVersion;
      for (const d of all.body) {
        described.push(d);
        rows.push(versionRow(d, d.modelVersion === defaultVersion));
      }
    }
    $("#models tbody").replaceChildren(...rows);
    if ($("#notice").textContent.startsWith("models:")) notice("");
    models.described = described;
    const names = [...new Set(described.map((d) => d.modelName))];
    fillSelect($("#try-model"), names);
    enableChat([...new Set(described.filter(isGenerative).map((d) => d.modelName))]);
  }

  function fillSelect(select, names) {
    const kept = select.value;
    select.replaceChildren(...names.map((n) => el("option", { value: n, text: n })));
    if (names.includes(kept)) select.value = kept;
  }

  function enableChat(names) {
    models.generative = names;
    $("#nav-chat").hidden = names.length === 0;
    fillSelect($("#chat-model"), names);
  }

  // ----- traffic ---------------------------------------------------------------------------------

  const traffic = { last: null, at: 0, history: {} };
  const COLOURS = ["#c2410c", "#2563eb", "#15803d", "#7c3aed", "#0891b2", "#b91c1c"];

  async function pollMetrics() {
    const response = await fetch(metricsUrl, { headers: headers("management") });
    if (!response.ok) {
      const why = response.status === 401 ? "metrics need the management token" : "metrics are off";
      $("#stats tbody").replaceChildren(el("tr", {}, el("td", { text: why })));
      return;
    }
    const now = performance.now();
    const summary = LanternMetrics.summarise(LanternMetrics.parse(await response.text()));
    if (traffic.last) {
      const rows = LanternMetrics.between(traffic.last, summary, (now - traffic.at) / 1000);
      const fmt = (x, digits = 1) => (Number.isFinite(x) ? x.toFixed(digits) : "–");
      $("#stats tbody").replaceChildren(...Object.entries(rows).map(([model, r]) => el("tr", { "data-model": model },
        el("td", { text: model }), el("td", { class: "num rate", text: fmt(r.rate, 2) }),
        el("td", { class: "num", text: fmt(r.p50) }), el("td", { class: "num", text: fmt(r.p99) }),
        el("td", { class: "num", text: fmt(r.errors, 2) }))));
      for (const [model, r] of Object.entries(rows)) {
        const series = (traffic.history[model] ||= []);
        series.push(r.rate);
        if (series.length > 90) series.shift();
      }
    } else {
      // A rate needs two polls; until the second one, the chart shows its models and says so.
      for (const model of Object.keys(summary)) traffic.history[model] ||= [];
    }
    drawChart();
    traffic.last = summary;
    traffic.at = now;
  }

  function drawChart() {
    const canvas = $("#rate-chart");
    const g = canvas.getContext("2d");
    g.clearRect(0, 0, canvas.width, canvas.height);
    const all = Object.values(traffic.history).flat();
    const top = Math.max(1, ...all);
    g.fillStyle = "#6b7380";
    g.font = "11px sans-serif";
    g.fillText(`${top.toFixed(1)} req/s`, 4, 12);
    if (!all.length) g.fillText("measuring: the first rate comes with the next poll", 4, canvas.height / 2);
    Object.entries(traffic.history).forEach(([model, series], i) => {
      g.strokeStyle = COLOURS[i % COLOURS.length];
      g.fillStyle = g.strokeStyle;
      g.fillText(model, canvas.width - 120, 14 + 13 * i);
      g.beginPath();
      series.forEach((y, x) => {
        const px = (x / 89) * (canvas.width - 8) + 4;
        const py = canvas.height - 4 - (y / top) * (canvas.height - 24);
        if (x === 0) g.moveTo(px, py); else g.lineTo(px, py);
        if (series.length === 1) g.fillRect(px - 2, py - 2, 4, 4);  // one rate is a point, not a line
      });
      g.stroke();
    });
  }

  // ----- try it ----------------------------------------------------------------------------------

  function showTop(answer) {
    const scores = Array.isArray(answer) && answer.length === 1 ? answer[0] : answer;
    const list = $("#try-top");
    list.replaceChildren();
    if (!scores || typeof scores !== "object" || Array.isArray(scores)) return;
    const entries = Object.entries(scores).filter(([, v]) => typeof v === "number");
    entries.sort((a, b) => b[1] - a[1]);
    list.replaceChildren(...entries.slice(0, 5).map(([label, p]) => el("li", {}, el("b", { class: "label", text: label }), el("span", { text: p.toFixed(3) }))));
  }

  async function tryIt(event) {
    event.preventDefault();
    const model = $("#try-model").value;
    const mode = $("#try-mode").value;
    const init = { method: "POST", headers: headers("inference") };
    if (mode === "file") {
      const file = $("#try-file").files[0];
      if (!file) { notice("choose a file first", "error"); return; }
      init.body = file;
      init.headers["content-type"] = file.type || "application/octet-stream";
    } else {
      init.body = $("#try-text").value;
      init.headers["content-type"] = mode === "json" ? "application/json" : "text/plain";
    }
    const started = performance.now();
    const response = await fetch(`${inferenceRoot}/predictions/${encodeURIComponent(model)}`, init);
    const text = await response.text();
    const ms = performance.now() - started;
    $("#try-latency").textContent = `${response.status} in ${ms.toFixed(1)} ms`;
    let answer = text;
    try { answer = JSON.parse(text); } catch (_) { /* text answer */ }
    $("#try-result").textContent = typeof answer === "string" ? answer : JSON.stringify(answer, null, 2);
    if (response.ok) showTop(answer); else $("#try-top").replaceChildren();
  }

  // ----- chat ------------------------------------------------------------------------------------

  const conversation = [];

  async function chat(event) {
    event.preventDefault();
    const input = $("#chat-input");
    const text = input.value.trim();
    if (!text) return;
    input.value = "";
    conversation.push({ role: "user", content: text });
    const log = $("#chat-log");
    log.append(el("div", { class: "msg user", text }));
    const reply = el("div", { class: "msg assistant streaming" });
    log.append(reply);
    try {
      const answer = await LanternChat.stream(`${inferenceRoot}/v1/chat/completions`, headers("inference"),
        $("#chat-model").value, conversation, (piece) => { reply.textContent += piece; });
      conversation.push({ role: "assistant", content: answer.whole });
      log.append(el("div", { class: "msg-stats", text: LanternChat.statsLine(answer) }));
    } catch (err) {
      reply.textContent = String(err);
      reply.classList.add("error");
    }
    reply.classList.remove("streaming");
  }

  // ----- API docs --------------------------------------------------------------------------------

  let docsLoaded = false;
  async function loadDocs() {
    if (docsLoaded) return;
    docsLoaded = true;
    const box = $("#docs");
    for (const [kind, root] of [["management", ""], ["inference", inferenceRoot]]) {
      const response = await fetch(root + "/", { method: "OPTIONS" });
      const section = el("section", { class: "api", "data-api": kind });
      box.append(section);
      if (!response.ok) { section.textContent = `${kind}: ${response.status}`; continue; }
      LanternDocs.render(section, await response.json(), root, () => headers(kind));
    }
  }

  // ----- wiring ----------------------------------------------------------------------------------

  function show(view) {
    for (const button of document.querySelectorAll("nav button")) button.classList.toggle("active", button.dataset.view === view);
    for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== `view-${view}`;
    if (view === "docs") loadDocs();
  }

  for (const button of document.querySelectorAll("nav button")) button.addEventListener("click", () => show(button.dataset.view));
  $("#tokens").addEventListener("submit", (event) => {
    event.preventDefault();
    tokens.management = $("#mgmt-token").value.trim();
    tokens.inference = $("#inf-token").value.trim();
    $("#mgmt-token").value = "";
    $("#inf-token").value = "";
    const set = Object.entries(tokens).filter(([, v]) => v).map(([k]) => k);
    $("#token-state").textContent = set.length ? `using ${set.join(" and ")} token` : "no token";
    refreshModels();
  });
  $("#register").addEventListener("submit", (event) => {
    event.preventDefault();
    const url = $("#register-url").value.trim();
    if (!url) return;
    const workers = $("#register-workers").value || "1";
    act(`Register ${url} with ${workers} workers?`, "POST",
      `/models?url=${encodeURIComponent(url)}&initial_workers=${encodeURIComponent(workers)}&synchronous=true`);
  });
  $("#try-mode").addEventListener("change", () => {
    const file = $("#try-mode").value === "file";
    $("#try-file").hidden = !file;
    $("#try-text").hidden = file;
  });
  $("#try").addEventListener("submit", tryIt);
  $("#chat").addEventListener("submit", chat);

  const busy = () => document.activeElement && document.activeElement.closest("#models, #register, dialog");
  refreshModels();
  pollMetrics();
  setInterval(() => { if (!busy()) refreshModels(); }, 5000);
  setInterval(pollMetrics, 2000);

  window.lantern = { refreshModels, isGenerative, enableChat, show };
})();
