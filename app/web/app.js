// zerocalc page: a form, its state in the URL, and charts drawn as inline SVG.
// Every figure comes from this service's API (same origin); nothing is computed here but the
// pixel positions and unit conversions for labels. GB = 1e9 bytes, GiB = 2^30 bytes.
"use strict";

(() => {
  const GB = 1e9;
  const GIB = 2 ** 30;
  const UNIT_BYTES = { GB, GiB: GIB };
  const SVGNS = "http://www.w3.org/2000/svg";
  const SWEEP_ND = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
  const STAGE_COLORS = ["#6b7280", "#2563eb", "#d97706", "#059669"];
  const COMPONENTS = [
    // [response key, label, colour]
    ["parameters", "parameters", "#2563eb"],
    ["gradients", "gradients", "#f59e0b"],
    ["optimizer_states", "optimizer states", "#10b981"],
    ["activations", "activations", "#8b5cf6"],
    ["temporary_buffers", "buffers", "#ef4444"],
  ];
  // Select elements filled from the API's own enums (/openapi.json), with these as fallback.
  const ENUMS = {
    precision: ["Precision", ["mixed_fp16", "mixed_bf16", "fp32", "bf16"]],
    optimizer: ["Optimizer", ["adam", "adamw", "sgd", "sgd_momentum", "adafactor", "adam_8bit"]],
    gradients: ["GradientConvention", ["paper", "fp32_grads"]],
    offload_optimizer: ["OffloadDevice", ["none", "cpu", "nvme"]],
    offload_params: ["OffloadDevice", ["none", "cpu", "nvme"]],
    engine: ["Engine", ["paper", "deepspeed", "torch"]],
    activation_checkpointing: ["Checkpointing", ["none", "full", "selective"]],
    activation: ["Activation", ["gelu", "relu", "silu"]],
  };
  const INITIAL = { source: "preset", preset: "llama3-8b", dp: "8", precision: "mixed_bf16" };
  // Where an API error's field lives in the form.
  const FIELD_TO_INPUT = {
    "model.params": "params",
    "model.preset": "preset",
    "offload.optimizer": "offload_optimizer",
    "offload.params": "offload_params",
  };

  const $ = (sel, root = document) => root.querySelector(sel);
  const form = $("#form");
  let presets = [];
  let defaults = {};
  let seq = 0;
  let inflight = null;
  let job = null;

  // ---------- formatting ----------
  const num = (x, digits = 2) =>
    x.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  // Below 0.01 GB a size is written in MB (10^6) / MiB (2^20) so it does not read as 0.00.
  const SMALL = { GB: ["MB", 1e6], GiB: ["MiB", 2 ** 20] };
  const inUnit = (bytes, unit) => (bytes !== 0 && Math.abs(bytes) < 0.01 * UNIT_BYTES[unit]
    ? `${num(bytes / SMALL[unit][1])} ${SMALL[unit][0]}`
    : `${num(bytes / UNIT_BYTES[unit])} ${unit}`);
  const both = (bytes) => `${inUnit(bytes, "GB")} (${inUnit(bytes, "GiB")})`;
  const exact = (bytes) => `${bytes.toLocaleString("en-US")} bytes`;

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children) node.append(c);
    return node;
  }

  function svg(tag, attrs = {}, text) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function tip(node, text) {
    node.append(svg("title", {}, text));
    return node;
  }

  // ---------- form state <-> URL ----------
  function readForm() {
    const state = {};
    for (const c of form.elements) {
      if (!c.name || c.name === "stage") continue;
      state[c.name] = c.type === "checkbox" ? (c.checked ? "1" : "0") : c.value;
    }
    state.stages = [...form.querySelectorAll('input[name="stage"]:checked')]
      .map((c) => c.value)
      .join(",");
    return state;
  }

  function writeForm(state) {
    for (const [name, value] of Object.entries(state)) {
      if (name === "stages") {
        const wanted = new Set(String(value).split(",").filter((s) => s !== ""));
        form.querySelectorAll('input[name="stage"]').forEach((c) => {
          c.checked = wanted.has(c.value);
        });
        continue;
      }
      const c = form.elements.namedItem(name);
      if (!c || c instanceof RadioNodeList) continue;
      if (c.type === "checkbox") c.checked = value === "1" || value === "true";
      else if (c.tagName === "SELECT" && ![...c.options].some((o) => o.value === value)) continue;
      else c.value = value;
    }
  }

  // Inputs that belong to one way of naming the model; the URL keeps only the chosen way's.
  const ARCH_INTS = ["layers", "hidden", "heads", "vocab_size"];
  const ARCH_OPTIONAL_INTS = ["kv_heads", "ffn_hidden", "max_seq_len", "head_dim", "embed_proj_dim",
    "num_experts", "experts_per_token", "position_offset"];
  const ARCH_ENUMS = ["norm", "position_embedding", "activation"];
  const ARCH_FLAGS = ["bias", "tied_embeddings", "gated_mlp", "lm_head_bias", "final_norm", "embedding_norm"];
  const ARCH_FIELDS = [...ARCH_INTS, ...ARCH_OPTIONAL_INTS, ...ARCH_ENUMS, ...ARCH_FLAGS, "qkv_bias"];
  const SOURCE_FIELDS = { preset: ["preset"], params: ["params"], architecture: ARCH_FIELDS, hf_config: ["hf_config"] };

  function stateToQuery(state) {
    const q = new URLSearchParams();
    const unused = new Set(Object.entries(SOURCE_FIELDS)
      .filter(([source]) => source !== state.source).flatMap(([, fields]) => fields));
    for (const [k, v] of Object.entries(state)) if (defaults[k] !== v && !unused.has(k)) q.set(k, v);
    if (job && job.status === "succeeded") q.set("job", job.id);
    return q.toString();
  }

  function syncUrl(state) {
    const query = stateToQuery(state);
    const url = `${location.pathname}${query ? `?${query}` : ""}`;
    history.replaceState(null, "", url);
    $("#share").href = url;
  }

  function syncVisibility() {
    const source = form.elements.source.value;
    form.querySelectorAll("[data-source]").forEach((d) => {
      d.hidden = d.dataset.source !== source;
    });
    $("#batch-fields").classList.toggle("disabled", !form.elements.use_batch.checked);
    const p = presets.find((x) => x.name === form.elements.preset.value);
    $("#preset-info").textContent = p
      ? `Ψ = ${p.params.toLocaleString("en-US")} parameters (published ${p.published_params.toLocaleString("en-US")}). ${p.source}`
      : "";
    let bytes;
    try {
      bytes = deviceBytes(readForm());
    } catch {
      bytes = undefined;
    }
    $('input[name="device_memory"]').title = bytes ? exact(bytes) : "no device memory: fits is not computed";
  }

  // ---------- request bodies ----------
  class FormError extends Error {
    constructor(field, message) {
      super(message);
      this.field = field;
    }
  }

  function integer(value, field, { optional = false } = {}) {
    const s = String(value).trim().replace(/[,_\s]/g, "");
    if (s === "") {
      if (optional) return undefined;
      throw new FormError(field, "required");
    }
    const m = /^(\d+(?:\.\d+)?)(?:e(\d+))?([kmbgt]?)$/i.exec(s);
    if (!m) throw new FormError(field, "must be a whole number (7500000000, 7.5e9 or 7.5B)");
    const suffix = { "": 0, k: 3, m: 6, b: 9, g: 9, t: 12 }[m[3].toLowerCase()];
    const n = Number(`${m[1]}e${Number(m[2] || 0) + suffix}`);
    if (!Number.isSafeInteger(n)) throw new FormError(field, "must be a whole number");
    return n;
  }

  function deviceBytes(state) {
    const v = String(state.device_memory).trim();
    if (v === "") return undefined;
    const x = Number(v);
    if (!Number.isFinite(x) || x <= 0) throw new FormError("device_memory", "must be a positive size");
    // Number("80e9") parses the decimal exactly, so 80 GB is exactly 80,000,000,000 bytes.
    const bytes = state.device_unit === "GB" ? Number(`${v}e9`) : Math.round(x * GIB);
    return Math.round(bytes);
  }

  function modelSpec(s) {
    switch (s.source) {
      case "preset":
        return { preset: s.preset };
      case "params":
        return { params: integer(s.params, "params") };
      case "architecture": {
        const a = {};
        for (const k of ARCH_INTS) a[k] = integer(s[k], k);
        for (const k of ARCH_OPTIONAL_INTS) {
          const v = integer(s[k], k, { optional: true });
          if (v !== undefined) a[k] = v;
        }
        for (const k of ARCH_ENUMS) a[k] = s[k];
        for (const k of ARCH_FLAGS) a[k] = s[k] === "1";
        if (s.qkv_bias !== "") a.qkv_bias = s.qkv_bias === "1";
        return { architecture: a };
      }
      case "hf_config": {
        let body;
        try {
          body = JSON.parse(s.hf_config);
        } catch (e) {
          throw new FormError("hf_config", `not valid JSON (${e.message})`);
        }
        if (body === null || typeof body !== "object" || Array.isArray(body)) {
          throw new FormError("hf_config", "must be a JSON object");
        }
        return { hf_config: body };
      }
      default:
        throw new FormError("source", "unknown model source");
    }
  }

  function stagesOf(s) {
    const stages = s.stages.split(",").filter((x) => x !== "").map(Number);
    if (stages.length === 0) throw new FormError("stage", "pick at least one stage");
    return stages;
  }

  function batchOf(s) {
    if (s.use_batch !== "1") return undefined;
    const every = integer(s.checkpoint_every_n_layers ?? "", "checkpoint_every_n_layers", { optional: true });
    return {
      micro_batch_size: integer(s.micro_batch_size, "micro_batch_size"),
      seq_len: integer(s.seq_len, "seq_len"),
      activation_checkpointing: s.activation_checkpointing,
      grad_accumulation_steps: integer(s.grad_accumulation_steps, "grad_accumulation_steps"),
      ...(s.padded === "1" ? { padded: true } : {}),
      ...(s.checkpoint_offload === "1" ? { checkpoint_offload: true } : {}),
      ...(every !== undefined && every !== 1 ? { checkpoint_every_n_layers: every } : {}),
    };
  }

  function memoryBody(s) {
    const body = {
      model: modelSpec(s),
      dp: integer(s.dp, "dp"),
      tp: integer(s.tp, "tp"),
      pp: integer(s.pp, "pp"),
      stages: stagesOf(s),
      precision: s.precision,
      optimizer: s.optimizer,
      gradients: s.gradients,
      offload: { optimizer: s.offload_optimizer, params: s.offload_params },
      engine: s.engine,
    };
    if (String(s.k).trim() !== "") {
      const k = Number(s.k);
      if (!Number.isFinite(k)) throw new FormError("k", "must be a number");
      body.k = k;
    }
    const batch = batchOf(s);
    if (batch) body.batch = batch;
    const dev = deviceBytes(s);
    if (dev !== undefined) body.device_memory = dev;
    return body;
  }

  function communicationBody(s, mem) {
    // The memory request's training fields (not its batch or device size) plus the cluster.
    const { batch, device_memory: _unused, ...body } = mem;
    if (batch) body.grad_accumulation_steps = batch.grad_accumulation_steps;
    const nodes = integer(s.nodes, "nodes", { optional: true });
    const gpn = integer(s.gpus_per_node, "gpus_per_node", { optional: true });
    if (nodes !== undefined) body.nodes = nodes;
    if (gpn !== undefined) body.gpus_per_node = gpn;
    if (s.interconnect) body.interconnect = s.interconnect;
    if (s.inter_node_interconnect) body.inter_node_interconnect = s.inter_node_interconnect;
    return body;
  }

  function measureBody(s) {
    // The memory request's training fields, run by a real engine (torch or deepspeed).
    const { device_memory: _unused, ...body } = memoryBody(s);
    return { ...body, engine: s.measure_engine, mode: s.mode, device: s.device };
  }

  // ---------- HTTP ----------
  async function post(path, body, signal, headers = {}, retries = 2) {
    const r = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json", ...headers },
      body: JSON.stringify(body),
      signal,
    });
    if (r.status === 503 && retries > 0) {
      // The service is busy: wait as long as its Retry-After asks (at most 5 s), then retry.
      const wait = Math.min(Number(r.headers.get("Retry-After")) || 1, 5);
      await new Promise((resolve) => setTimeout(resolve, wait * 1000));
      return post(path, body, signal, headers, retries - 1);
    }
    let data = null;
    try {
      data = await r.json();
    } catch {
      data = null;
    }
    return { status: r.status, ok: r.ok, data };
  }

  function problems(res) {
    const detail = res.data && res.data.detail;
    if (Array.isArray(detail)) return detail.map((d) => ({ field: d.field || "", msg: d.msg || "" }));
    if (typeof detail === "string") return [{ field: "", msg: detail }];
    return [{ field: "", msg: `HTTP ${res.status}` }];
  }

  // ---------- errors ----------
  function inputFor(field) {
    const name = FIELD_TO_INPUT[field] || field.split(".").pop();
    if (field.startsWith("model.hf_config")) return form.elements.namedItem("hf_config");
    const c = form.elements.namedItem(name);
    return c instanceof RadioNodeList ? c[0] : c;
  }

  function showErrors(list) {
    form.querySelectorAll(".invalid").forEach((c) => {
      c.classList.remove("invalid");
      c.removeAttribute("aria-invalid");
    });
    const box = $("#error");
    box.replaceChildren();
    if (!list.length) {
      box.hidden = true;
      return;
    }
    box.append(el("strong", { text: "The service cannot answer these inputs:" }));
    const ul = el("ul");
    for (const p of list) {
      ul.append(el("li", {}, el("code", { text: p.field || "request" }), `: ${p.msg}`));
      const c = p.field ? inputFor(p.field) : null;
      if (c) {
        c.classList.add("invalid");
        c.setAttribute("aria-invalid", "true");
      }
    }
    box.append(ul);
    box.hidden = false;
  }

  // ---------- charts ----------
  function niceStep(max, ticks = 5) {
    const raw = max / ticks;
    const p = 10 ** Math.floor(Math.log10(raw));
    const m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  }

  function frame(width, height, label) {
    return svg("svg", {
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": label,
      class: "plot",
      preserveAspectRatio: "xMidYMid meet",
    });
  }

  function legend(root, items, x, y) {
    items.forEach(([label, color, dashed], i) => {
      const g = svg("g", { transform: `translate(${x + (i % 3) * 150},${y + Math.floor(i / 3) * 18})` });
      if (dashed) g.append(svg("line", { x1: 0, y1: 6, x2: 14, y2: 6, stroke: color, "stroke-width": 2, "stroke-dasharray": "4 3" }));
      else g.append(svg("rect", { x: 0, y: 0, width: 12, height: 12, fill: color, rx: 2 }));
      g.append(svg("text", { x: 18, y: 10, class: "legend" }, label));
      root.append(g);
    });
  }

  function drawBars(target, stages, deviceMemory, unit) {
    const W = 640, H = 340, L = 76, R = 16, T = 50, B = 44;
    const root = frame(W, H, `Stacked memory per device per stage, in ${unit}`);
    root.dataset.unit = unit;
    const totals = stages.map((s) => COMPONENTS.reduce((a, [k]) => a + (s.per_device[k] || 0), 0));
    const top = Math.max(...totals, deviceMemory || 0, 1) / UNIT_BYTES[unit];
    const step = niceStep(top);
    const ymax = Math.ceil(top / step) * step;
    const y = (v) => T + (H - T - B) * (1 - v / ymax);
    const digits = Math.max(0, -Math.floor(Math.log10(step)));
    for (let v = 0; v <= ymax + step / 2; v += step) {
      root.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
      root.append(svg("text", { x: L - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, num(v, digits)));
    }
    root.append(svg("text", { x: 14, y: (T + H - B) / 2, class: "axis", transform: `rotate(-90 14 ${(T + H - B) / 2})`, "text-anchor": "middle" }, `${unit} per device (${unit === "GB" ? "10^9" : "2^30"} bytes)`));
    const slot = (W - L - R) / stages.length;
    const bw = Math.min(90, slot * 0.55);
    stages.forEach((s, i) => {
      const x = L + slot * i + (slot - bw) / 2;
      let acc = 0;
      const g = svg("g", { class: "bar", "data-stage": s.stage });
      for (const [k, label, color] of COMPONENTS) {
        const b = s.per_device[k] || 0;
        if (b <= 0) continue;
        const y0 = y((acc + b) / UNIT_BYTES[unit]);
        const h = y(acc / UNIT_BYTES[unit]) - y0;
        g.append(tip(svg("rect", { x, y: y0, width: bw, height: Math.max(h, 0.5), fill: color, "data-component": k, "data-bytes": b }), `stage ${s.stage} ${label}: ${both(b)}`));
        acc += b;
      }
      root.append(g);
      root.append(svg("text", { x: x + bw / 2, y: y(acc / UNIT_BYTES[unit]) - 6, class: "value", "text-anchor": "middle" }, inUnit(acc, unit)));
      root.append(svg("text", { x: x + bw / 2, y: H - B + 18, class: "tick", "text-anchor": "middle" }, `stage ${s.stage}`));
    });
    if (deviceMemory) {
      const yy = y(deviceMemory / UNIT_BYTES[unit]);
      root.append(tip(svg("line", { x1: L, x2: W - R, y1: yy, y2: yy, class: "device-line", "data-bytes": deviceMemory }), `device memory: ${both(deviceMemory)}`));
      root.append(svg("text", { x: W - R, y: yy - 5, class: "device-label", "text-anchor": "end" }, `device ${inUnit(deviceMemory, unit)}`));
    }
    const items = COMPONENTS.map(([, label, color]) => [label, color]);
    if (deviceMemory) items.push(["device memory", "#111827", true]);
    legend(root, items, L, 8);
    target.replaceChildren(root);
  }

  function drawSweep(target, series, dp, deviceMemory, unit) {
    const W = 640, H = 360, L = 76, R = 16, T = 56, B = 44;
    const root = frame(W, H, `Memory per device vs Nd, log scale, in ${unit}`);
    root.dataset.unit = unit;
    const values = series.flatMap((s) => s.points.map((p) => p.bytes / UNIT_BYTES[unit])).filter((v) => v > 0);
    if (deviceMemory) values.push(deviceMemory / UNIT_BYTES[unit]);
    if (!values.length) {
      target.replaceChildren(el("p", { class: "note", text: "No figures for this sweep." }));
      return;
    }
    const lo = Math.floor(Math.log10(Math.min(...values)));
    const hi = Math.max(Math.ceil(Math.log10(Math.max(...values))), lo + 1);
    const x = (nd) => L + ((W - L - R) * Math.log2(nd)) / Math.log2(SWEEP_ND[SWEEP_ND.length - 1]);
    const y = (v) => T + ((H - T - B) * (hi - Math.log10(v))) / (hi - lo);
    for (let e = lo; e <= hi; e++) {
      const v = 10 ** e;
      root.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
      root.append(svg("text", { x: L - 6, y: y(v) + 4, class: "tick", "text-anchor": "end" }, v >= 1 ? v.toLocaleString("en-US") : String(Number(v.toPrecision(1)))));
    }
    for (const nd of SWEEP_ND) {
      root.append(svg("text", { x: x(nd), y: H - B + 18, class: "tick", "text-anchor": "middle" }, String(nd)));
    }
    root.append(svg("text", { x: (L + W - R) / 2, y: H - 6, class: "axis", "text-anchor": "middle" }, "Nd (data-parallel degree, log scale)"));
    root.append(svg("text", { x: 14, y: (T + H - B) / 2, class: "axis", transform: `rotate(-90 14 ${(T + H - B) / 2})`, "text-anchor": "middle" }, `${unit} per device (log scale)`));
    if (dp >= 1 && dp <= SWEEP_ND[SWEEP_ND.length - 1]) {
      root.append(svg("line", { x1: x(dp), x2: x(dp), y1: T, y2: H - B, class: "current" }));
    }
    if (deviceMemory) {
      const yy = y(deviceMemory / UNIT_BYTES[unit]);
      root.append(tip(svg("line", { x1: L, x2: W - R, y1: yy, y2: yy, class: "device-line" }), `device memory: ${both(deviceMemory)}`));
    }
    for (const s of series) {
      const color = STAGE_COLORS[s.stage];
      const pts = s.points.filter((p) => p.bytes > 0);
      const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p.nd).toFixed(1)},${y(p.bytes / UNIT_BYTES[unit]).toFixed(1)}`).join("");
      const g = svg("g", { class: "series", "data-stage": s.stage });
      g.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 2 }));
      for (const p of pts) {
        g.append(tip(svg("circle", { cx: x(p.nd), cy: y(p.bytes / UNIT_BYTES[unit]), r: 3, fill: color, "data-nd": p.nd, "data-bytes": p.bytes }), `stage ${s.stage}, Nd = ${p.nd}: ${both(p.bytes)}`));
      }
      root.append(g);
    }
    const items = series.map((s) => [`stage ${s.stage}`, STAGE_COLORS[s.stage]]);
    if (deviceMemory) items.push(["device memory", "#111827", true]);
    legend(root, items, L, 8);
    target.replaceChildren(root);
  }

  function drawPairs(target, rows, unit, labels, label) {
    // rows: [{name, a, b}] drawn as grouped horizontal bars (a = predicted, b = measured).
    const W = 640, rowH = 46, T = 30, L = 110, R = 150;
    const H = T + rows.length * rowH + 10;
    const root = frame(W, H, label);
    root.dataset.unit = unit;
    const max = Math.max(1, ...rows.flatMap((r) => [r.a || 0, r.b || 0]));
    const x = (v) => L + ((W - L - R) * v) / max;
    const colors = ["#2563eb", "#f59e0b"];
    rows.forEach((r, i) => {
      const y0 = T + i * rowH;
      root.append(svg("text", { x: L - 8, y: y0 + 22, class: "tick", "text-anchor": "end" }, r.name));
      [r.a, r.b].forEach((v, j) => {
        if (v === null || v === undefined) return;
        const yy = y0 + 4 + j * 19;
        root.append(tip(svg("rect", { x: L, y: yy, width: Math.max(x(v) - L, 0.5), height: 16, fill: colors[j], "data-bytes": v }), `${r.name} ${labels[j]}: ${both(v)}`));
        root.append(svg("text", { x: x(v) + 6, y: yy + 12, class: "value" }, r.fmt ? r.fmt(v, j) : inUnit(v, unit)));
      });
    });
    legend(root, labels.map((l, j) => [l, colors[j]]), L, 8);
    target.replaceChildren(root);
  }

  // ---------- tables ----------
  function bytesCell(bytes, readable) {
    if (bytes === null || bytes === undefined) return el("td", { class: "na", text: "—", title: "not estimated for these inputs" });
    return el("td", { "data-bytes": bytes, title: exact(bytes), text: readable || both(bytes) });
  }

  function memoryTable(resp) {
    const table = $("#memory-table");
    const head = el("tr", {}, el("th", { text: "per device" }));
    for (const s of resp.stages) head.append(el("th", { text: `stage ${s.stage}`, scope: "col" }));
    const rows = [
      ["parameters", "parameters"], ["gradients", "gradients"], ["optimizer_states", "optimizer states"],
      ["model_states", "model states"], ["activations", "activations"],
      ["temporary_buffers", "buffers"], ["resident", "resident"], ["peak", "peak"],
    ];
    const body = [];
    for (const [key, label] of rows) {
      const tr = el("tr", { "data-key": key }, el("th", { text: label, scope: "row" }));
      for (const s of resp.stages) {
        const td = bytesCell(s.per_device[key], s.per_device_readable && s.per_device_readable[key]);
        td.dataset.stage = s.stage;
        tr.append(td);
      }
      body.push(tr);
    }
    for (const where of ["cpu", "nvme"]) {
      if (!resp.stages.some((s) => s[where] && s[where].total)) continue;
      const tr = el("tr", { "data-key": `${where}.total` }, el("th", { text: `${where.toUpperCase()} per rank`, scope: "row" }));
      for (const s of resp.stages) tr.append(bytesCell(s[where].total));
      body.push(tr);
    }
    if (resp.stages.some((s) => s.fits !== null && s.fits !== undefined)) {
      const tr = el("tr", { "data-key": "fits" }, el("th", { text: "fits device", scope: "row" }));
      for (const s of resp.stages) {
        tr.append(el("td", { class: s.fits ? "yes" : "no", text: s.fits === null ? "—" : s.fits ? "yes" : "no" }));
      }
      body.push(tr);
    }
    const notes = resp.stages.flatMap((s) => (s.notes || []).map((n) => `stage ${s.stage}: ${n}`));
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...body));
    if (notes.length) {
      table.append(el("caption", { class: "notes", text: notes.join(" · ") }));
    }
  }

  function conventionText(resp) {
    const c = resp.convention;
    const parts = [
      `Ψ = ${resp.params.toLocaleString("en-US")} parameters`,
      `${resp.params_per_device.toLocaleString("en-US")} per device after TP × PP`,
      `Nd = ${resp.dp}, TP = ${resp.tp}, PP = ${resp.pp}`,
      `K = ${c.k}`,
    ];
    $("#convention").replaceChildren(
      el("span", { text: parts.join(" · ") }), el("br"),
      el("span", { class: "hint", text: `Convention — ${c.description}` }),
    );
  }

  // ---------- panels ----------
  function markStale(stale) {
    for (const id of ["#memory-panel", "#sweep-panel", "#comm-panel"]) $(id).classList.toggle("stale", stale);
  }

  async function runMemory(state, body, signal, mySeq) {
    const unit = state.chart_unit;
    $("#memory-status").textContent = "computing…";
    const res = await post("/v1/memory", body, signal);
    if (mySeq !== seq) return;
    if (!res.ok) {
      $("#memory-status").textContent = "";
      showErrors(problems(res));
      markStale(true);
      return false;
    }
    showErrors([]);
    markStale(false);
    $("#memory-status").textContent = "";
    conventionText(res.data);
    memoryTable(res.data);
    drawBars($("#bars-chart"), res.data.stages, body.device_memory, unit);
    return true;
  }

  async function runSweep(state, body, signal, mySeq) {
    const unit = state.chart_unit;
    const answers = await Promise.all(
      SWEEP_ND.map((nd) => post("/v1/memory", { ...body, dp: nd }, signal).then((r) => [nd, r])),
    );
    if (mySeq !== seq) return;
    const series = body.stages.map((stage) => ({ stage, points: [] }));
    let usesPeak = false;
    for (const [nd, r] of answers) {
      if (!r.ok) continue;
      for (const s of r.data.stages) {
        const line = series.find((x) => x.stage === s.stage);
        const bytes = s.per_device.peak ?? s.per_device.resident;
        usesPeak = usesPeak || s.per_device.peak !== null;
        if (line) line.points.push({ nd, bytes });
      }
    }
    $("#sweep-caption").textContent =
      `Nd = 1 to 1024 (powers of two), log–log; one line per stage; ${usesPeak ? "peak" : "resident"} bytes per device from POST /v1/memory at each Nd. The vertical line marks Nd = ${body.dp}.`;
    drawSweep($("#sweep-chart"), series, body.dp, body.device_memory, unit);
  }

  async function runCommunication(state, memBody, signal, mySeq) {
    let body;
    try {
      body = communicationBody(state, memBody);
    } catch (e) {
      if (!(e instanceof FormError)) throw e;
      commNote(`${e.field}: ${e.message}`);
      return;
    }
    const res = await post("/v1/communication", body, signal);
    if (mySeq !== seq) return;
    if (res.status !== 200) {
      const why = res.status === 404 || res.status === 405
        ? "This service does not offer POST /v1/communication yet."
        : `POST /v1/communication answered ${res.status}: ${problems(res).map((p) => `${p.field || "request"}: ${p.msg}`).join("; ")}`;
      commNote(why);
      return;
    }
    $("#comm-note").hidden = true;
    $("#comm-body").hidden = false;
    const stages = res.data.stages || [];
    const table = $("#comm-table");
    const head = el("tr", {}, ...["stage", "sent per rank", "ratio to DDP", "time", "collectives"].map((t) => el("th", { text: t, scope: "col", class: t === "collectives" ? "ops" : null })));
    const rows = stages.map((s) => {
      const ops = (s.collectives || []).map((c) =>
        `${c.op} (${c.phase}) ×${c.calls}: ${both(c.sent_bytes_per_rank)}`).join("; ");
      return el("tr", { "data-stage": s.stage },
        el("th", { scope: "row", text: `stage ${s.stage}` }),
        bytesCell(s.sent_bytes_per_rank, s.sent_readable),
        el("td", { text: s.ratio_to_ddp === null || s.ratio_to_ddp === undefined ? "—" : `${num(s.ratio_to_ddp, 3)}×` }),
        el("td", { text: s.time_seconds === null || s.time_seconds === undefined ? "—" : `${num(s.time_seconds * 1000, 1)} ms` }),
        el("td", { class: "ops", text: ops }));
    });
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    const t = res.data.topology;
    const links = res.data.links || {};
    const link = (l) => (l ? `${l.name} (${num(l.bandwidth / GB, 0)} GB/s per direction)` : "");
    $("#comm-topology").textContent = t
      ? `${t.nodes} node${t.nodes === 1 ? "" : "s"} × ${t.gpus_per_node} GPUs${t.assumed ? " (assumed)" : ""} · intra-node ${link(links.intra_node)} · inter-node ${link(links.inter_node)}`
      : "";
    const conv = res.data.convention;
    $("#comm-convention").textContent = conv ? `Convention — ${conv.description} Time: ${conv.time_model || ""} ${conv.ignores || ""}` : "";
    drawPairs($("#comm-chart"), stages.map((s) => ({
      name: `stage ${s.stage}`,
      a: s.sent_bytes_per_rank,
      b: null,
      fmt: (v) => `${inUnit(v, state.chart_unit)}${s.time_seconds !== null && s.time_seconds !== undefined ? ` · ${num(s.time_seconds * 1000, 1)} ms` : ""}`,
    })), state.chart_unit, ["sent bytes per rank"], "Communication bytes per rank per stage");
  }

  function commNote(text) {
    $("#comm-body").hidden = true;
    const note = $("#comm-note");
    note.textContent = text;
    note.hidden = false;
  }

  async function update() {
    const state = readForm();
    syncVisibility();
    syncUrl(state);
    if (inflight) inflight.abort();
    inflight = new AbortController();
    const { signal } = inflight;
    const mySeq = ++seq;
    let body;
    try {
      body = memoryBody(state);
    } catch (e) {
      if (!(e instanceof FormError)) throw e;
      showErrors([{ field: e.field, msg: e.message }]);
      markStale(true);
      document.body.dataset.ready = String(mySeq);
      return;
    }
    document.body.dataset.busy = "1";
    try {
      const ok = await runMemory(state, body, signal, mySeq);
      if (ok) await Promise.all([runSweep(state, body, signal, mySeq), runCommunication(state, body, signal, mySeq)]);
    } catch (e) {
      if (e.name !== "AbortError") showErrors([{ field: "", msg: `request failed: ${e.message}` }]);
    } finally {
      if (mySeq === seq) {
        delete document.body.dataset.busy;
        document.body.dataset.ready = String(mySeq);
      }
    }
  }

  let timer = null;
  function schedule() {
    clearTimeout(timer);
    document.body.dataset.pending = "1";
    timer = setTimeout(() => {
      delete document.body.dataset.pending;
      update();
    }, 200);
  }

  // ---------- plan ----------
  const STEP_PARTS = [
    // [step_time key, label, colour]
    ["matmul", "GEMMs and attention", "#2563eb"],
    ["memory_bound", "memory-bound kernels", "#60a5fa"],
    ["gpu_idle", "GPU idle, waiting for the host", "#94a3b8"],
    ["optimizer_step", "optimizer step", "#10b981"],
    ["exposed_communication", "exposed communication", "#f59e0b"],
    ["offload_transfer", "offload transfer", "#ef4444"],
  ];
  const PLAN_ROWS = 12;

  function planBody(s) {
    const body = {
      model: modelSpec(s),
      gpu: s.plan_gpu,
      gpus: integer(s.plan_gpus, "plan_gpus"),
      global_batch_size: integer(s.plan_global_batch, "plan_global_batch"),
      seq_len: integer(s.plan_seq_len, "plan_seq_len"),
      engine: s.plan_engine,
      precision: s.precision,
      optimizer: s.optimizer,
    };
    const gpn = integer(s.gpus_per_node, "gpus_per_node", { optional: true });
    if (gpn !== undefined) body.gpus_per_node = gpn;
    if (s.interconnect) body.interconnect = s.interconnect;
    if (s.inter_node_interconnect) body.inter_node_interconnect = s.inter_node_interconnect;
    return body;
  }

  const seconds = (x) => (x < 1 ? `${num(x * 1000, 1)} ms` : `${num(x, 3)} s`);

  function configName(c) {
    const parts = [`stage ${c.stage}`, `${c.micro_batch_size} × ${c.grad_accumulation_steps}`];
    const every = c.checkpoint_every_n_layers > 1 ? ` every ${c.checkpoint_every_n_layers} layers` : "";
    if (c.activation_checkpointing !== "none") parts.push(`ckpt ${c.activation_checkpointing}${every}${c.checkpoint_offload ? " (inputs on host)" : ""}`);
    if (c.offload !== "none") parts.push(`offload ${c.offload}`);
    if (c.shard_group_size) parts.push(`HSDP ${c.shard_group_size}`);
    return parts.join(", ");
  }

  function shortName(c) {
    // the chart's row label: "#3 s3 1×32 sel opt" (stage, micro × accumulation, checkpointing, offload)
    const ck = ({ none: "", selective: " sel", full: " full" }[c.activation_checkpointing] ?? ` ${c.activation_checkpointing}`) + (c.checkpoint_every_n_layers > 1 ? `/${c.checkpoint_every_n_layers}` : "") + (c.checkpoint_offload ? "→cpu" : "");
    const off = { none: "", optimizer: " opt→cpu", optimizer_and_params: " opt+par→cpu" }[c.offload] ?? ` ${c.offload}`;
    return `s${c.stage} ${c.micro_batch_size}×${c.grad_accumulation_steps}${ck}${off}${c.shard_group_size ? ` hsdp${c.shard_group_size}` : ""}`;
  }

  function drawSteps(target, candidates) {
    // One horizontal bar per candidate, stacked by step-time part, in seconds.
    const W = 720, rowH = 26, T = 52, L = 200, R = 70, B = 30;
    const H = T + candidates.length * rowH + B;
    const root = frame(W, H, "Predicted step time per configuration, stacked by part, in seconds");
    const max = Math.max(...candidates.map((c) => c.step_time_seconds), 1e-9);
    const step = niceStep(max);
    const xmax = Math.ceil(max / step) * step;
    const x = (v) => L + ((W - L - R) * v) / xmax;
    const digits = Math.max(0, -Math.floor(Math.log10(step)));
    for (let v = 0; v <= xmax + step / 2; v += step) {
      root.append(svg("line", { x1: x(v), x2: x(v), y1: T, y2: H - B, class: "grid" }));
      root.append(svg("text", { x: x(v), y: H - B + 16, class: "tick", "text-anchor": "middle" }, num(v, digits)));
    }
    root.append(svg("text", { x: (L + W - R) / 2, y: H - 2, class: "axis", "text-anchor": "middle" }, "seconds per optimizer step"));
    candidates.forEach((c, i) => {
      const y0 = T + i * rowH + 4;
      const g = svg("g", { class: "step", "data-rank": c.rank });
      root.append(svg("text", { x: L - 8, y: y0 + 13, class: "tick", "text-anchor": "end" }, `#${c.rank} ${shortName(c.config)}`));
      let acc = 0;
      for (const [k, label, color] of STEP_PARTS) {
        const v = c.step_time[k] || 0;
        if (v <= 0) continue;
        g.append(tip(svg("rect", { x: x(acc), y: y0, width: Math.max(x(acc + v) - x(acc), 0.5), height: 18, fill: color, "data-part": k, "data-seconds": v }), `#${c.rank} ${label}: ${seconds(v)}`));
        acc += v;
      }
      root.append(g);
      root.append(svg("text", { x: x(acc) + 6, y: y0 + 13, class: "value" }, seconds(c.step_time_seconds)));
    });
    legend(root, STEP_PARTS.map(([, label, color]) => [label, color]), 20, 8);
    target.replaceChildren(root);
  }

  function hostOptimizer(a) {
    // where an offloaded candidate's optimizer steps: the host figure, its threads and its source
    const threads = a.host_optimizer_threads ? ` on ${a.host_optimizer_threads} thread(s) per rank` : "";
    return `optimizer on the host at ${(a.host_optimizer_bandwidth / 1e9).toPrecision(3)} GB/s per rank${threads}: ${a.host_optimizer_source}`;
  }

  function offloadTitle(c, a) {
    // what the offload cell's seconds are made of: the optimizer's host step, checkpoint copies
    const parts = [];
    if (c.config.offload !== "none") parts.push(hostOptimizer(a));
    if (c.config.checkpoint_offload) parts.push(`layer inputs to the host and back: ${seconds(c.step_time.checkpoint_transfer)}`);
    return parts.length ? parts.join("; ") : null;
  }

  function planTable(resp) {
    const cols = ["#", "configuration", "tokens/s", "step", "compute", "exposed comm", "offload", "peak", "headroom"];
    const head = el("tr", {}, ...cols.map((t) => el("th", { text: t, scope: "col", class: t === "configuration" ? "config" : null })));
    const rows = resp.candidates.slice(0, PLAN_ROWS).map((c) => el("tr", { "data-rank": c.rank },
      el("th", { scope: "row", text: String(c.rank) }),
      el("td", { class: "config", text: configName(c.config) }),
      el("td", { "data-tokens": c.tokens_per_second, text: Math.round(c.tokens_per_second).toLocaleString("en-US") }),
      el("td", { "data-seconds": c.step_time_seconds, text: seconds(c.step_time_seconds) }),
      el("td", { text: seconds(c.step_time.compute), title: `micro-steps ${c.step_time.bound}-bound (GPU work ${seconds(c.step_time.gpu_busy)}: GEMMs and attention ${seconds(c.step_time.matmul)}, memory-bound ${seconds(c.step_time.memory_bound)}; host dispatch ${seconds(c.step_time.host_dispatch)}) + optimizer step ${seconds(c.step_time.optimizer_step)}` }),
      el("td", { text: seconds(c.step_time.exposed_communication), title: `all collectives: ${seconds(c.step_time.communication)}; ${c.assumptions.reason}` }),
      el("td", { text: seconds(c.step_time.offload_transfer), title: offloadTitle(c, resp.assumptions) }),
      bytesCell(c.per_device.peak),
      bytesCell(c.headroom)));
    const table = $("#plan-table");
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    const rejected = resp.rejected.filter((r) => r.over_by !== null);
    const closest = rejected.length ? rejected.reduce((a, b) => (a.over_by <= b.over_by ? a : b)) : null;
    table.append(el("caption", {
      text: `${resp.evaluated} configurations evaluated: ${resp.candidates.length} fit, ${resp.rejected.length} rejected`
        + (closest ? ` (closest: ${configName(closest.config)}, ${closest.reason})` : "") + ".",
    }));
  }

  function planNote(text) {
    const n = $("#plan-note");
    n.textContent = text || "";
    n.hidden = !text;
  }

  async function runPlan() {
    planNote("");
    let body;
    try {
      body = planBody(readForm());
    } catch (e) {
      if (!(e instanceof FormError)) throw e;
      planNote(`${e.field}: ${e.message}`);
      return;
    }
    $("#plan-start").disabled = true;
    $("#plan-status").textContent = "planning…";
    try {
      const res = await post("/v1/plan", body);
      if (res.status !== 200) {
        $("#plan-result").hidden = true;
        planNote(`POST /v1/plan answered ${res.status}: ${problems(res).map((p) => `${p.field || "request"}: ${p.msg}`).join("; ")}`);
        return;
      }
      const resp = res.data;
      $("#plan-status").textContent = `${resp.candidates.length} of ${resp.evaluated} configurations fit`;
      if (!resp.candidates.length) {
        $("#plan-result").hidden = true;
        planNote("No configuration fits this GPU; the closest ones are listed in the API's rejected[].");
        return;
      }
      drawSteps($("#plan-chart"), resp.candidates.slice(0, PLAN_ROWS));
      planTable(resp);
      const cal = resp.calibration;
      $("#plan-calibration").textContent = `GEMM efficiency ${num(cal.efficiency, 3)} of ${resp.gpu.label}'s dense peak (${num(resp.gpu.peak_flops / 1e12, 1)} TFLOP/s): ${cal.source}. Host dispatch ${num(cal.host_seconds_per_kernel * 1e6, 1)} µs per kernel: ${cal.host_source}.`;
      $("#plan-result").hidden = false;
    } finally {
      $("#plan-start").disabled = false;
      if ($("#plan-status").textContent === "planning…") $("#plan-status").textContent = "";
    }
  }

  // ---------- measure ----------
  function fraction(progress) {
    if (typeof progress === "number") return progress > 1 ? progress / 100 : progress;
    if (progress && typeof progress === "object") {
      if (typeof progress.fraction === "number") return progress.fraction;
      const done = progress.done ?? progress.completed ?? progress.current;
      if (typeof done === "number" && typeof progress.total === "number" && progress.total > 0) return done / progress.total;
    }
    return null;
  }

  function progressText(progress) {
    if (progress && typeof progress === "object") {
      return progress.message || progress.phase || progress.step || "";
    }
    return "";
  }

  function measureNote(text) {
    const n = $("#measure-note");
    n.textContent = text || "";
    n.hidden = !text;
  }

  function setJob(data) {
    job = data;
    const running = data && (data.status === "queued" || data.status === "running");
    $("#measure-start").disabled = running;
    $("#measure-cancel").disabled = !running;
    $("#measure-progress-wrap").hidden = !data;
    if (!data) return;
    const f = data.status === "succeeded" ? 1 : fraction(data.progress);
    const bar = $("#measure-progress");
    if (f === null) bar.removeAttribute("value");
    else bar.value = Math.max(0, Math.min(1, f));
    const pct = f === null ? "" : ` ${Math.round(f * 100)}%`;
    const extra = progressText(data.progress);
    $("#measure-status").textContent = `job ${data.id}: ${data.status}${pct}${extra ? ` — ${extra}` : ""}`;
    if (data.status === "failed") measureNote(`The measurement failed: ${data.error || "no reason given"}`);
    if (data.status === "succeeded" && data.result) renderMeasurement(data.result);
    syncUrl(readForm());
  }

  function apiKeyHeaders() {
    const key = $("#api-key").value.trim();
    return key ? { "X-API-Key": key } : {};
  }

  async function poll(id) {
    while (job && job.id === id && (job.status === "queued" || job.status === "running")) {
      await new Promise((r) => setTimeout(r, 1000));
      const r = await fetch(`/v1/measure/${encodeURIComponent(id)}`, { headers: { Accept: "application/json", ...apiKeyHeaders() } });
      if (!r.ok) {
        measureNote(`GET /v1/measure/${id} answered ${r.status}`);
        setJob({ ...job, status: "failed" });
        return;
      }
      setJob(await r.json());
    }
  }

  async function startMeasure() {
    measureNote("");
    $("#measure-result").hidden = true;
    let body;
    try {
      body = measureBody(readForm());
    } catch (e) {
      if (!(e instanceof FormError)) throw e;
      showErrors([{ field: e.field, msg: e.message }]);
      return;
    }
    const res = await post("/v1/measure", body, undefined, apiKeyHeaders());
    if (res.status === 404 || res.status === 405) {
      measureNote("This service does not offer POST /v1/measure.");
      return;
    }
    if (!res.ok) {
      measureNote(`POST /v1/measure answered ${res.status}: ${problems(res).map((p) => `${p.field || "request"}: ${p.msg}`).join("; ")}`);
      return;
    }
    setJob({ progress: 0, ...res.data });
    poll(res.data.id);
  }

  async function cancelMeasure() {
    if (!job) return;
    const r = await fetch(`/v1/measure/${encodeURIComponent(job.id)}`, { method: "DELETE", headers: apiKeyHeaders() });
    if (r.ok) {
      const data = await r.json().catch(() => null);
      setJob(data && data.status ? data : { ...job, status: "cancelled" });
    } else {
      measureNote(`DELETE /v1/measure/${job.id} answered ${r.status}`);
    }
  }

  function relErr(run, key) {
    // The runner's own relative_error per figure; computed here only where it gave none.
    const e = run.relative_error;
    if (e && typeof e === "object" && typeof e[key] === "number") return e[key];
    if (typeof e === "number" && key === "resident") return e;
    const m = run.measured && run.measured[key];
    const p = run.predicted && run.predicted[key];
    return typeof m === "number" && typeof p === "number" && m !== 0 ? (p - m) / m : null;
  }

  function percent(e) {
    return e === null || e === undefined ? "—" : `${e >= 0 ? "+" : ""}${num(e * 100, 2)} %`;
  }

  function commFigures(c) {
    // {measured_sent_bytes_per_rank, predicted_..., relative_error} or {measured: {...}, predicted: {...}}
    if (!c) return null;
    const pick = (v) => (typeof v === "number" ? v : v && typeof v.sent_bytes_per_rank === "number" ? v.sent_bytes_per_rank : null);
    const m = typeof c.measured_sent_bytes_per_rank === "number" ? c.measured_sent_bytes_per_rank : pick(c.measured);
    const p = typeof c.predicted_sent_bytes_per_rank === "number" ? c.predicted_sent_bytes_per_rank : pick(c.predicted);
    if (m === null || p === null) return null;
    const e = typeof c.relative_error === "number" ? c.relative_error : m ? (p - m) / m : null;
    return { m, p, e };
  }

  function renderMeasurement(result) {
    const runs = result.runs || [];
    const table = $("#measure-table");
    const head = el("tr", {}, ...["stage", "figure", "measured", "predicted", "relative error"].map((t) => el("th", { text: t, scope: "col" })));
    const rows = [];
    const about = [];
    for (const run of runs) {
      const measured = run.measured || {};
      const predicted = run.predicted || {};
      const isNum = (v) => typeof v === "number";
      const keys = ["resident", "peak"].filter((k) => isNum(measured[k]) || isNum(predicted[k]));
      for (const k of Object.keys(measured)) {
        if (!keys.includes(k) && isNum(measured[k]) && isNum(predicted[k])) keys.push(k);
      }
      for (const k of keys) {
        rows.push(el("tr", { "data-stage": run.stage, "data-key": k },
          el("th", { scope: "row", text: `stage ${run.stage}` }),
          el("td", { text: k.replaceAll("_", " ") }),
          bytesCell(measured[k]),
          bytesCell(predicted[k]),
          el("td", { class: "rel", text: percent(relErr(run, k)) })));
      }
      const c = commFigures(run.communication);
      if (c) {
        rows.push(el("tr", { "data-stage": run.stage, "data-key": "communication" },
          el("th", { scope: "row", text: `stage ${run.stage}` }),
          el("td", { text: "sent bytes per rank" }),
          bytesCell(c.m), bytesCell(c.p),
          el("td", { class: "rel", text: percent(c.e) })));
      }
      const bits = [run.engine_name || run.engine, run.mode, run.device && `on ${run.device}`,
        run.world_size && `world of ${run.world_size}`,
        isNum(run.step_time_s) && `${num(run.step_time_s, 3)} s per step`].filter(Boolean);
      if (bits.length) about.push(`stage ${run.stage}: ${bits.join(", ")}`);
    }
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    if (about.length) table.append(el("caption", { text: about.join(" · ") }));
    const unit = form.elements.chart_unit.value;
    const pairs = runs.flatMap((run) => ["resident", "peak"]
      .filter((k) => run.measured && typeof run.measured[k] === "number")
      .map((k) => ({
        name: `stage ${run.stage} ${k}`,
        a: run.predicted ? run.predicted[k] : null,
        b: run.measured[k],
      })));
    drawPairs($("#measure-chart"), pairs, unit, ["predicted", "measured"],
      `Predicted vs measured bytes per device, in ${unit}`);
    $("#measure-result").hidden = false;
  }

  async function resumeJob(id) {
    const r = await fetch(`/v1/measure/${encodeURIComponent(id)}`, { headers: { Accept: "application/json" } });
    if (!r.ok) return;
    setJob(await r.json());
    poll(id);
  }

  // ---------- start-up ----------
  function fillSelect(select, values) {
    const keep = select.value;
    select.replaceChildren(...values.map((v) => el("option", { value: v, text: v })));
    if (values.includes(keep)) select.value = keep;
  }

  async function fetchJson(path) {
    try {
      const r = await fetch(path, { headers: { Accept: "application/json" } });
      return r.ok ? await r.json() : null;
    } catch {
      return null;
    }
  }

  function applyPreset(name) {
    const p = presets.find((x) => x.name === name);
    if (!p) return;
    const a = p.architecture;
    const s = {};
    for (const k of ARCH_FIELDS) {
      if (typeof a[k] === "boolean") s[k] = a[k] ? "1" : "0";
      else s[k] = a[k] === null || a[k] === undefined ? "" : String(a[k]);
    }
    if (a.qkv_bias === null || a.qkv_bias === undefined) s.qkv_bias = "";
    writeForm(s);
  }

  async function init() {
    const [schema, presetList] = await Promise.all([fetchJson("/openapi.json"), fetchJson("/v1/presets")]);
    const schemas = (schema && schema.components && schema.components.schemas) || {};
    for (const [name, [schemaName, fallback]] of Object.entries(ENUMS)) {
      const values = (schemas[schemaName] && schemas[schemaName].enum) || fallback;
      fillSelect(form.elements.namedItem(name), values);
    }
    presets = presetList || [];
    const links = await fetchJson("/v1/interconnects");
    if (Array.isArray(links)) {
      for (const name of ["interconnect", "inter_node_interconnect"]) {
        const select = form.elements.namedItem(name);
        select.append(...links.map((l) => el("option", { value: l.name, text: `${l.name} (${num(l.bandwidth / GB, 0)} GB/s)` })));
      }
    }
    const gpus = await fetchJson("/v1/gpus");
    if (Array.isArray(gpus) && gpus.length) {
      const select = form.elements.namedItem("plan_gpu");
      select.replaceChildren(...gpus.map((g) => el("option", { value: g.name, text: `${g.name} (${g.label})` })));
      select.value = "h100-sxm";
    }
    fillSelect(form.elements.preset, presets.map((p) => p.name));
    writeForm(INITIAL);
    applyPreset(form.elements.preset.value);
    defaults = readForm();
    const query = new URLSearchParams(location.search);
    const fromUrl = Object.fromEntries([...query.entries()].filter(([k]) => k !== "job"));
    writeForm(fromUrl);
    // A preset link: the architecture fields start from that preset, ready to edit.
    if (!ARCH_FIELDS.some((k) => k in fromUrl)) applyPreset(form.elements.preset.value);
    form.addEventListener("input", (ev) => {
      if (ev.target.name === "preset") applyPreset(ev.target.value);
      schedule();
    });
    form.addEventListener("change", schedule);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      update();
    });
    for (const id of ["#measure-mode", "#measure-device", "#measure-engine"]) $(id).addEventListener("change", () => syncUrl(readForm()));
    $("#measure-start").addEventListener("click", startMeasure);
    $("#plan-start").addEventListener("click", runPlan);
    $("#measure-cancel").addEventListener("click", cancelMeasure);
    await update();
    if (query.get("job")) resumeJob(query.get("job"));
  }

  document.addEventListener("DOMContentLoaded", init);
})();
