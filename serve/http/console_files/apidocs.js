"use strict";
// Interactive API docs from an OpenAPI 3 description: a form per route that sends the request.
(function () {
  const el = (tag, attrs = {}, ...children) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    node.append(...children);
    return node;
  };

  // The URL for `path` with its {params} and the query filled in from `values`.
  function requestUrl(base, path, parameters, values) {
    let url = path.replace(/\{([^}]+)\}/g, (_, name) => encodeURIComponent(values[name] || ""));
    const query = new URLSearchParams();
    for (const p of parameters) {
      if (p.in === "query" && values[p.name] !== undefined && values[p.name] !== "") {
        query.set(p.name, values[p.name]);
      }
    }
    const qs = query.toString();
    return base + url + (qs ? "?" + qs : "");
  }

  function routeForm(base, path, method, op, headers) {
    const parameters = [...(op.parameters || [])];
    for (const name of path.matchAll(/\{([^}]+)\}/g)) {
      if (!parameters.some((p) => p.name === name[1])) parameters.push({ in: "path", name: name[1], required: true });
    }
    const form = el("form", { autocomplete: "off" });
    const inputs = {};
    for (const p of parameters) {
      const input = el("input", { name: p.name, placeholder: p.in + (p.required ? ", required" : "") });
      inputs[p.name] = input;
      form.append(el("label", { text: p.name }), input);
    }
    let body = null;
    if (op.requestBody || method === "post" || method === "put") {
      body = el("textarea", { rows: "4", name: "body", placeholder: "request body (JSON or text)" });
      form.append(el("label", { text: "body" }), body);
    }
    const out = el("pre", { class: "answer" });
    form.append(el("span"), el("button", { type: "submit", text: "Send" }));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const values = Object.fromEntries(Object.entries(inputs).map(([k, i]) => [k, i.value]));
      const init = { method: method.toUpperCase(), headers: headers() };
      if (body && body.value) {
        init.body = body.value;
        init.headers["content-type"] = /^\s*[[{]/.test(body.value) ? "application/json" : "text/plain";
      }
      const started = performance.now();
      try {
        const response = await fetch(requestUrl(base, path, parameters, values), init);
        const text = await response.text();
        const ms = (performance.now() - started).toFixed(1);
        out.textContent = `${response.status} ${response.statusText} (${ms} ms)\n${text}`;
      } catch (err) {
        out.textContent = String(err);
      }
    });
    return el("div", {}, form, out);
  }

  // Renders `spec` into `container`; requests go to `base` (the API's root) with headers().
  function render(container, spec, base, headers) {
    container.append(el("h3", { text: `${spec.info.title} ${spec.info.version}` }));
    for (const [path, ops] of Object.entries(spec.paths || {})) {
      for (const [method, op] of Object.entries(ops)) {
        const summary = el("summary", {}, el("span", { class: "method", text: method.toUpperCase() }),
          `${path} `, el("small", { text: op.summary || "" }));
        const details = el("details", { class: "route", "data-route": `${method.toUpperCase()} ${path}` }, summary);
        details.addEventListener("toggle", () => {
          if (details.open && details.children.length === 1) details.append(routeForm(base, path, method, op, headers));
        }, { once: false });
        container.append(details);
      }
    }
  }

  window.LanternDocs = { render, requestUrl };
})();
