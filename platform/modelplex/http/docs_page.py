"""`GET /docs`: the HTTP API described from `/openapi.json` in one self-contained page (no CDN, no
script from elsewhere: Swagger UI's assets are not shipped, and servers often cannot reach the internet)."""
from __future__ import annotations

DOCS_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>modelplex HTTP API</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:70em;padding:0 1em;color:#222}
h1{font-size:1.5em} h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ddd}
.op{margin:.4em 0;padding:.4em .6em;border:1px solid #e4e4e4;border-radius:4px}
.m{display:inline-block;min-width:4.5em;font-weight:600;font-family:monospace}
.p{font-family:monospace} .s{color:#555;margin-left:.6em}
details pre{background:#f6f6f6;padding:.6em;overflow:auto;font-size:12px}
</style></head>
<body><h1>modelplex HTTP API</h1>
<p>Generated from <a href="/openapi.json">/openapi.json</a> (OpenAPI), grouped by tag.</p>
<div id="api">Loading...</div>
<script>
fetch("/openapi.json").then(r => r.json()).then(doc => {
  const groups = {};
  for (const [path, ops] of Object.entries(doc.paths || {})) {
    for (const [method, op] of Object.entries(ops)) {
      const tag = (op.tags && op.tags[0]) || "other";
      (groups[tag] = groups[tag] || []).push([method.toUpperCase(), path, op]);
    }
  }
  const root = document.getElementById("api");
  root.textContent = "";
  for (const tag of Object.keys(groups).sort()) {
    const h = document.createElement("h2"); h.textContent = tag; root.appendChild(h);
    for (const [method, path, op] of groups[tag]) {
      const div = document.createElement("div"); div.className = "op";
      const m = document.createElement("span"); m.className = "m"; m.textContent = method;
      const p = document.createElement("span"); p.className = "p"; p.textContent = path;
      const s = document.createElement("span"); s.className = "s"; s.textContent = op.summary || "";
      div.append(m, p, s);
      const body = op.requestBody || op.parameters;
      if (body) {
        const d = document.createElement("details"), sum = document.createElement("summary"),
              pre = document.createElement("pre");
        sum.textContent = "request"; pre.textContent = JSON.stringify(body, null, 2);
        d.append(sum, pre); div.appendChild(d);
      }
      root.appendChild(div);
    }
  }
}).catch(e => { document.getElementById("api").textContent = "could not read /openapi.json: " + e; });
</script></body></html>
"""
