// The status page: reads the server's own KServe v2 / Triton APIs every REFRESH_MS and renders
// models, states, adapters, request rates and latencies, and for LLMs the engine's running and
// waiting requests, KV-cache use, TTFT and ITL; load/unload buttons call the repository API.
"use strict";
const REFRESH_MS = 2000;
let previous = {};  // "model/version" -> {time, success, ns, queueNs}: rates are differences between refreshes
let previousEngine = {};  // model -> latency sums and counts at the last refresh

function headers() {
  const token = document.getElementById("token").value || localStorage.getItem("modelplexToken") || "";
  return token ? {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
               : {"Content-Type": "application/json"};
}

async function call(method, path, body) {
  const response = await fetch(path, {method, headers: headers(), body: body && JSON.stringify(body)});
  const text = await response.text();
  const data = text ? JSON.parse(text) : {};
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${data.error || text}`);
  return data;
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function rates(stat, now) {
  const key = `${stat.name}/${stat.version}`;
  const s = stat.inference_stats, cur = {time: now, success: s.success.count, ns: s.success.ns, queueNs: s.queue.ns};
  const before = previous[key] || cur;
  previous[key] = cur;
  const n = cur.success - before.success, seconds = (cur.time - before.time) / 1000;
  const mean = (ns, count) => count ? (ns / count / 1e6).toFixed(3) : "–";
  return {
    rate: seconds > 0 ? (n / seconds).toFixed(1) : "–",
    // Over the last interval when there was traffic, else since load.
    latency: n ? mean(cur.ns - before.ns, n) : mean(cur.ns, cur.success),
    queue: n ? mean(cur.queueNs - before.queueNs, n) : mean(cur.queueNs, cur.success),
    success: cur.success, fail: s.fail.count,
  };
}

function actionButton(name, action) {
  const button = document.createElement("button");
  button.textContent = action;
  button.dataset.action = action;
  button.dataset.model = name;
  button.onclick = async () => {
    button.disabled = true;
    try {
      await call("POST", `/v2/repository/models/${encodeURIComponent(name)}/${action}`, {});
      document.getElementById("error").textContent = "";
    } catch (e) {
      document.getElementById("error").textContent = e.message;
    }
    await refresh();
  };
  return button;
}

// Adapters per model, from the OpenAI model list (an adapter's `parent` is its model); {} without it.
async function adaptersByModel() {
  try {
    const models = await call("GET", "/v1/models");
    const byModel = {};
    for (const m of models.data || []) if (m.parent) (byModel[m.parent] ||= []).push(m.id);
    return byModel;
  } catch (e) {
    return {};
  }
}

// One model's engine occupancy and latencies (LLM backends), summed over its instances; null for others.
async function engineRow(name) {
  let instances;
  try {
    instances = (await call("GET", `/v2/models/${encodeURIComponent(name)}/engine_stats`)).instances || [];
  } catch (e) {
    return null;
  }
  const engines = instances.filter((i) => i.num_blocks !== undefined);
  if (!engines.length) return null;
  const sum = (key) => engines.reduce((total, i) => total + (i[key] || 0), 0);
  const cur = {ttft: sum("ttft_seconds_sum"), ttftN: sum("ttft_count"), itl: sum("itl_seconds_sum"), itlN: sum("itl_count")};
  const before = previousEngine[name] || {ttft: 0, ttftN: 0, itl: 0, itlN: 0};
  previousEngine[name] = cur;
  // Over the last interval when requests came, else since load.
  const mean = (s, n, s0, n0) => (n > n0 ? ((s - s0) / (n - n0) * 1000).toFixed(1)
                                  : n ? (s / n * 1000).toFixed(1) : "–");
  const blocks = sum("num_blocks");
  return {
    model: name, running: sum("num_running"), waiting: sum("num_waiting"),
    kv: blocks ? `${((1 - sum("num_free_blocks") / blocks) * 100).toFixed(1)}%` : "–",
    ttft: mean(cur.ttft, cur.ttftN, before.ttft, before.ttftN),
    itl: mean(cur.itl, cur.itlN, before.itl, before.itlN),
  };
}

function renderEngines(rows) {
  const body = document.getElementById("engines");
  body.replaceChildren();
  for (const r of rows) {
    const row = body.insertRow();
    row.dataset.model = r.model;
    cell(row, r.model);
    for (const v of [r.running, r.waiting, r.kv, r.ttft, r.itl]) cell(row, String(v), "num");
  }
  document.getElementById("llm").hidden = rows.length === 0;
}

async function refresh() {
  const now = Date.now();
  try {
    const [meta, index, stats, adapters] = await Promise.all([
      call("GET", "/v2"), call("POST", "/v2/repository/index", {}), call("GET", "/v2/models/stats"),
      adaptersByModel()]);
    const ready = (await fetch("/v2/health/ready")).ok;
    document.getElementById("server").textContent =
      `${meta.name} ${meta.version} — ${ready ? "ready" : "not ready"} — ${index.length} models listed`;
    const byKey = {};
    for (const s of stats.model_stats) byKey[`${s.name}/${s.version}`] = rates(s, now);
    const body = document.getElementById("models");
    body.replaceChildren();
    for (const m of index) {
      const row = body.insertRow();
      row.dataset.model = m.name;
      const state = m.state || "UNAVAILABLE";
      const r = byKey[`${m.name}/${m.version}`] || {};
      cell(row, m.name);
      cell(row, m.version || "–");
      cell(row, state, `state ${state}`);
      cell(row, m.reason || "");
      cell(row, (adapters[m.name] || []).join(", "), "adapters");
      for (const v of [r.rate, r.latency, r.queue, r.success, r.fail]) cell(row, v ?? "–", "num");
      cell(row, "").append(actionButton(m.name, state === "READY" ? "unload" : "load"));
    }
    const readyModels = [...new Set(index.filter((m) => m.state === "READY").map((m) => m.name))];
    renderEngines((await Promise.all(readyModels.map(engineRow))).filter((r) => r));
    document.getElementById("updated").textContent = `updated ${new Date(now).toLocaleTimeString()}`;
  } catch (e) {
    document.getElementById("server").textContent = "server unreachable";
    document.getElementById("error").textContent = e.message;
  }
}

document.getElementById("token").onchange = (e) => localStorage.setItem("modelplexToken", e.target.value);
refresh();
setInterval(refresh, REFRESH_MS);
