// The live dashboard: polls the JSON API once a second (/cache/tree, /cache/stats, /requests) and redraws.
// A failed poll marks the page disconnected and the next one tries again, so a restarted server is picked up.
"use strict";

const POLL_MS = 1000;
const {el, fmt} = radix;

const CHARTS = [
  {id: "hit_rate", title: "cache hit rate (cached / prompt tokens)", lines: [["hit_rate", "hit rate", "--green"]],
   min: 0, max: 1},
  {id: "kv", title: "KV slots", lines: [["kv_used", "used by requests", "--blue"],
    ["kv_locked", "of which locked tree nodes", "--orange"], ["kv_evictable", "cached, evictable", "--violet"]]},
  {id: "requests", title: "requests", lines: [["running", "running", "--blue"], ["queued", "queued", "--orange"]]},
  {id: "throughput", title: "tokens / s", lines: [["prefill_tps", "prefill", "--violet"], ["decode_tps", "decode", "--green"]]},
  {id: "ttft", title: "TTFT, s (last 30 s)", lines: [["ttft_p50", "p50", "--blue"], ["ttft_p90", "p90", "--orange"]]},
  {id: "tpot", title: "TPOT, s (last 30 s)", lines: [["tpot_p50", "p50", "--blue"], ["tpot_p90", "p90", "--orange"]]},
  {id: "evictions", title: "evicted tokens and retractions", lines: [["evicted", "evicted tokens", "--red"],
                                                                    ["retractions", "retractions", "--orange"]]},
  {id: "tiers", title: "cache hits by tier, tokens / s", lines: [["ram_hit_tps", "RAM", "--green"],
                                                                ["disk_hit_tps", "disk", "--violet"]], min: 0},
  {id: "disk", title: "disk tier: MB / s written and read, ms per load-back",
   lines: [["disk_write_mbs", "written", "--orange"], ["disk_read_mbs", "read", "--blue"],
           ["disk_load_ms", "ms per load", "--red"]], min: 0},
  {id: "speculation", title: "speculation: accepted / drafted, and its tok/s over plain decoding's",
   lines: [["spec_accept_rate", "acceptance", "--green"], ["spec_speedup", "speedup", "--blue"]], min: 0},
];

function color(v) { return getComputedStyle(document.documentElement).getPropertyValue(v).trim(); }

function setupCharts() {
  const box = document.getElementById("charts");
  for (const c of CHARTS) {
    const legend = el("div", {class: "legend"});
    for (const [, name, col] of c.lines) legend.append(el("span", {style: `color: var(${col})`, text: "— " + name}));
    box.append(el("div", {class: "chart", id: "chart-" + c.id}, el("h3", {text: c.title}), legend,
                  document.createElementNS("http://www.w3.org/2000/svg", "svg")));
  }
}

// One SVG line chart; the chart's element carries data-last and data-max of its first line, data-points and
// data-t (the newest sample's time) for tests.
function drawChart(c, samples) {
  const box = document.getElementById("chart-" + c.id);
  const svg = box.querySelector("svg");
  const W = 300, H = 100;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const values = c.lines.map(([key]) => samples.map((s) => s[key]));
  const all = values.flat().filter((v) => v !== null && v !== undefined);
  const lo = c.min !== undefined ? c.min : 0;
  const hi = c.max !== undefined ? c.max : Math.max(1e-9, ...all);
  let body = "";
  c.lines.forEach(([, , col], i) => {
    let d = "";
    values[i].forEach((v, j) => {
      if (v === null || v === undefined) return;
      const x = samples.length > 1 ? (j / (samples.length - 1)) * W : W;
      const y = H - 4 - ((v - lo) / (hi - lo || 1)) * (H - 8);
      d += (d ? " L" : "M") + x.toFixed(1) + " " + y.toFixed(1);
    });
    if (d) body += `<path d="${d}" fill="none" stroke="${color(col)}" stroke-width="1.5" vector-effect="non-scaling-stroke"/>`;
  });
  body += `<text x="4" y="12" fill="${color("--dim")}" font-size="10">${fmt(hi)}</text>`;
  svg.innerHTML = body;
  const first = values[0].filter((v) => v !== null && v !== undefined);
  box.dataset.last = first.length ? first[first.length - 1] : "";
  box.dataset.max = first.length ? Math.max(...first) : "";
  box.dataset.points = String(samples.length);
  box.dataset.t = samples.length ? String(samples[samples.length - 1].t) : "";
}

// An icicle chart: a row per depth, each node as wide as its share of its parent's tokens.
function drawTree(tree) {
  const box = document.getElementById("icicle");
  const byParent = new Map();
  for (const n of tree.nodes) {
    if (!byParent.has(n.parent)) byParent.set(n.parent, []);
    byParent.get(n.parent).push(n);
  }
  const rows = Math.max(1, ...tree.nodes.map((n) => n.depth));
  const rowH = Math.max(20, Math.min(40, 200 / rows));
  box.replaceChildren();
  const total = (byParent.get(-1) || []).reduce((a, n) => a + n.subtree_tokens, 0) || 1;
  const place = (parent, left, width, scale) => {
    let x = left;
    for (const n of byParent.get(parent) || []) {
      const w = n.subtree_tokens * scale;
      const shared = n.children >= 2;
      const cell = el("div", {class: "cell node" + (n.lock_ref ? " locked" : "") + (shared ? " shared" : ""),
        "data-id": n.id, "data-hits": n.hits, "data-tokens": n.tokens, "data-children": n.children,
        "data-shared": shared ? "1" : "0",
        title: `${n.tokens} tokens here, ${n.subtree_tokens} at and below\nhits ${n.hits}, idle ${fmt(n.idle_s, 1)} s` +
               `\n${n.lock_ref ? "locked by " + n.lock_ref : "evictable"}, tier ${n.tier}, namespace ${n.namespace}` +
               (n.preview !== null ? `\n${JSON.stringify(n.preview)}` : ""),
        style: `left:${x}%;width:${w}%;top:${(n.depth - 1) * rowH}px;height:${rowH - 2}px`});
      cell.textContent = `${fmt(n.tokens)} tok · ${n.hits} hits` + (n.preview ? " · " + n.preview : "");
      box.append(cell);
      place(n.id, x, w, n.subtree_tokens ? w / n.subtree_tokens : 0);
      x += w;
    }
  };
  place(-1, 0, 100, 100 / total);
  box.style.height = rows * rowH + "px";

  const body = document.querySelector("#nodes tbody");
  body.replaceChildren(...tree.nodes.slice(0, 12).map((n) => el("tr",
    {"data-hits": n.hits, "data-children": n.children},
    el("td", {text: n.depth}), el("td", {text: fmt(n.tokens)}), el("td", {text: fmt(n.subtree_tokens)}),
    el("td", {text: n.hits}), el("td", {text: fmt(n.idle_s, 1) + " s"}),
    el("td", {text: n.lock_ref ? `locked (${n.lock_ref})` : "evictable"}), el("td", {text: n.tier}),
    el("td", {text: n.namespace}),
    el("td", {class: "preview", text: n.preview === null ? "(previews off)" : n.preview}))));
  const ns = Object.entries(tree.namespaces).map(([k, v]) => `${k}: ${fmt(v)} tokens`).join(" · ");
  document.getElementById("namespaces").textContent = ns ? "Namespaces: " + ns : "The cache is empty.";
}

function drawRequests(r) {
  document.getElementById("inflight-total").textContent = r.total;
  document.querySelector("#inflight tbody").replaceChildren(...r.requests.map((q) => el("tr", {},
    el("td", {text: q.rid}), el("td", {text: q.state}), el("td", {text: q.prompt_tokens}),
    el("td", {text: q.cached_tokens}), el("td", {text: q.generated}), el("td", {text: q.grammar || "–"}),
    el("td", {text: q.priority}), el("td", {text: fmt(q.age_s, 1) + " s"}),
    el("td", {class: "preview", text: q.preview === null ? "(previews off)" : q.preview}))));
}

function drawInfo(info) {
  document.getElementById("model").textContent = `${info.model_path} · ${info.dtype} · ${info.device}`;
  const rows = [["model", info.model_path], ["hardware", info.device === "cpu" ? info.cpu : info.kernels],
                ["kernels", info.kernels], ["dtype", info.dtype], ["threads", info.threads],
                ["context", info.max_context], ["KV slots", info.kv_total], ["invariant", info.invariant]];
  const pairs = (list) => list.flatMap(([k, v]) => [el("dt", {text: k}), el("dd", {text: String(v)})]);
  const config = Object.entries(Object.assign({}, info.engine, info.server)).map(([k, v]) => [k, JSON.stringify(v)]);
  document.getElementById("info").replaceChildren(...pairs(rows),
    el("details", {}, el("summary", {text: "configuration"}), el("dl", {class: "info"}, ...pairs(config))));
}

let infoShown = false;

async function poll() {
  const status = document.getElementById("status");
  try {
    const [stats, tree, reqs] = await Promise.all([
      radix.json("/cache/stats"), radix.json("/cache/tree?top=60&depth=8"), radix.json("/requests")]);
    for (const c of CHARTS) drawChart(c, stats.series);
    const last = stats.series[stats.series.length - 1];
    if (last) {
      document.querySelector("#chart-kv h3").textContent =
        `KV slots (free now: ${fmt(last.kv_free)} of ${fmt(last.kv_free + last.kv_used + last.kv_evictable)})`;
    }
    const disk = stats.now && stats.now.disk;
    document.querySelector("#chart-disk h3").textContent = !disk ? "disk tier: none (--kv-disk-path)" :
      `disk tier: ${disk.on ? "on" : "OFF (" + disk.off_reason + ")"} · ${fmt(disk.pages)} pages, ` +
      `${fmt(disk.used_bytes / 1e6, 1)} of ${fmt(disk.capacity_bytes / 1e6, 0)} MB`;
    drawTree(tree);
    drawRequests(reqs);
    if (!infoShown) { drawInfo(stats.server); infoShown = true; }
    status.className = "ok";
    status.textContent = "live";
  } catch (e) {
    status.className = "down";
    status.textContent = e.status === 401 ? "needs the API key" : "reconnecting…";
    infoShown = false;
  }
  setTimeout(poll, POLL_MS);
}

setupCharts();
poll();
