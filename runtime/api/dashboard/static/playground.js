// The chat playground: streams /v1/chat/completions, keeps the conversation in the page, shows usage (with
// cached tokens) after each answer, and in JSON-schema mode checks the answer against the pasted schema.
"use strict";

const {el} = radix;
let history = [];

function num(id) {
  const v = document.getElementById(id).value;
  return v === "" ? undefined : Number(v);
}

// A small JSON-schema check (type, properties, required, enum, items, additionalProperties: false):
// the server enforces the whole schema, this tells the user what came back.
function validate(schema, value, path) {
  path = path || "$";
  if (schema === true || schema === undefined) return [];
  const errors = [];
  const types = {object: (v) => v !== null && typeof v === "object" && !Array.isArray(v), array: Array.isArray,
    string: (v) => typeof v === "string", integer: Number.isInteger, number: (v) => typeof v === "number",
    boolean: (v) => typeof v === "boolean", null: (v) => v === null};
  const want = [].concat(schema.type || []);
  if (want.length && !want.some((t) => types[t] && types[t](value))) return [`${path}: not ${want.join(" or ")}`];
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) errors.push(`${path}: not in enum`);
  if (types.object(value)) {
    for (const k of schema.required || []) if (!(k in value)) errors.push(`${path}: missing ${k}`);
    for (const [k, v] of Object.entries(value)) {
      if (schema.properties && k in schema.properties) errors.push(...validate(schema.properties[k], v, `${path}.${k}`));
      else if (schema.additionalProperties === false) errors.push(`${path}: unexpected ${k}`);
    }
  }
  if (Array.isArray(value) && schema.items) value.forEach((v, i) => errors.push(...validate(schema.items, v, `${path}[${i}]`)));
  return errors;
}

function request(schema) {
  const messages = [];
  const system = document.getElementById("system").value.trim();
  if (system) messages.push({role: "system", content: system});
  const body = {model: "default", messages: messages.concat(history), stream: true,
    stream_options: {include_usage: true}, temperature: num("temperature"), top_p: num("top_p"),
    max_tokens: num("max_tokens"), seed: num("seed")};
  if (schema) body.response_format = {type: "json_schema", json_schema: {name: "playground", schema}};
  return body;
}

// Yields the parsed `data:` events of a server-sent event stream.
async function* events(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buf += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function bubble(role, text) {
  const box = el("div", {class: "msg " + role}, el("span", {class: "text", text}));
  document.getElementById("messages").append(box);
  box.scrollIntoView({block: "end"});
  return box;
}

async function send() {
  const input = document.getElementById("input");
  const text = input.value.trim();
  if (!text) return;
  let schema = null;
  if (document.getElementById("json_mode").checked) {
    try { schema = JSON.parse(document.getElementById("schema").value); }
    catch (e) { bubble("assistant", "The schema is not valid JSON: " + e.message); return; }
  }
  input.value = "";
  history.push({role: "user", content: text});
  bubble("user", text);
  const box = bubble("assistant", "");
  const out = box.querySelector(".text");
  const button = document.getElementById("send");
  button.disabled = true;
  let answer = "", chunks = 0, usage = null, finish = null;
  try {
    const resp = await radix.call("/v1/chat/completions", {method: "POST", body: JSON.stringify(request(schema))});
    for await (const ev of events(resp)) {
      if (ev.usage) usage = ev.usage;
      for (const c of ev.choices || []) {
        if (c.delta && c.delta.content) { answer += c.delta.content; chunks += 1; out.textContent = answer; }
        if (c.finish_reason) finish = c.finish_reason;
      }
      box.dataset.chunks = String(chunks);
    }
    history.push({role: "assistant", content: answer});
    box.append(meta(usage, finish, schema, answer));
  } catch (e) {
    out.textContent = answer + (answer ? "\n" : "") + "Error: " + e.message;
    history.pop();
  } finally {
    box.dataset.done = "1";
    button.disabled = false;
  }
}

function meta(usage, finish, schema, answer) {
  const m = el("span", {class: "meta"});
  if (usage) {
    const cached = (usage.prompt_tokens_details || {}).cached_tokens || 0;
    m.append(el("span", {class: "usage", "data-cached": cached, "data-prompt": usage.prompt_tokens,
      text: `prompt ${usage.prompt_tokens} tokens (${cached} cached) · completion ${usage.completion_tokens}` +
            ` · finish ${finish}`}));
  }
  if (schema) {
    let errors;
    try { errors = validate(schema, JSON.parse(answer)); } catch (e) { errors = ["not JSON: " + e.message]; }
    m.append(el("span", {class: "validation", "data-valid": errors.length ? "0" : "1",
      text: errors.length ? " · invalid: " + errors.join("; ") : " · valid JSON for the schema"}));
  }
  return m;
}

document.getElementById("ask").onsubmit = (ev) => { ev.preventDefault(); send(); };
document.getElementById("input").onkeydown = (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); send(); }
};
document.getElementById("clear").onclick = () => { history = []; document.getElementById("messages").replaceChildren(); };
radix.json("/v1/models").then((r) => {
  document.getElementById("model").textContent = r.data.map((m) => m.id).join(", ");
}).catch(() => {});
