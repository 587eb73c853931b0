// Attention explorer: POST /attention {q, source, target} -> translation, pieces and cross-attention
// weights [layer][head][target][source] (layer: "all"); the heatmap is an HTML table (one cell per pair).
"use strict";
const $ = (id) => document.getElementById(id);
let data = null;
let timer = null;
let pending = 0;

function color(w) {
  // white (0) -> dark blue (1)
  const t = Math.max(0, Math.min(1, w));
  const r = Math.round(255 - t * (255 - 20));
  const g = Math.round(255 - t * (255 - 60));
  const b = Math.round(255 - t * (255 - 150));
  return `rgb(${r}, ${g}, ${b})`;
}

function selected() {
  const layer = Number($("layer").value);
  const head = $("head").value;
  const heads = data.weights[layer];
  if (head !== "mean") return heads[Number(head)];
  return heads[0].map((row, t) =>
    row.map((_, s) => heads.reduce((sum, h) => sum + h[t][s], 0) / heads.length));
}

function render() {
  const table = $("heatmap");
  table.replaceChildren();
  if (!data) return;
  const matrix = selected();
  const head = table.createTHead().insertRow();
  head.appendChild(document.createElement("th"));
  for (const piece of data.source_pieces) {
    const th = document.createElement("th");
    th.textContent = piece;
    head.appendChild(th);
  }
  const body = table.createTBody();
  matrix.forEach((row, t) => {
    const tr = body.insertRow();
    const th = document.createElement("th");
    th.textContent = data.target_pieces[t];
    tr.appendChild(th);
    row.forEach((w, s) => {
      const td = tr.insertCell();
      td.className = "cell";
      td.style.backgroundColor = color(w);
      td.style.color = w > 0.5 ? "#fff" : "#1d2330";
      td.title = `${data.target_pieces[t]} \u2190 ${data.source_pieces[s]}: ${w.toFixed(3)}`;
      td.dataset.weight = w.toFixed(4);
      td.textContent = w >= 0.1 ? w.toFixed(1).replace(/^0/, "") : "";
    });
  });
}

function fillSelect(select, values, keep) {
  const old = select.value;
  select.replaceChildren(...values.map(([value, label]) => new Option(label, value)));
  if (keep && values.some(([v]) => v === old)) select.value = old;
}

async function explore() {
  const q = $("source").value.trim();
  if (!q) return;
  const ticket = ++pending;
  $("status").textContent = "translating\u2026";
  $("status").className = "muted";
  try {
    const response = await fetch("/attention", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      // every layer and head: the page picks locally; the direction when the model has several
      body: JSON.stringify({ q, layer: "all", ...direction() }),
    });
    const body = await response.json();
    if (ticket !== pending) return; // a newer request is on its way
    if (!response.ok) throw new Error(body.error || response.statusText);
    data = body;
    $("translation").textContent = body.translation;
    fillSelect($("layer"), [...Array(body.layers).keys()].map((i) => [String(i), `${i + 1}`]), true);
    if (!$("layer").dataset.touched) $("layer").value = String(body.layers - 1);
    fillSelect($("head"), [["mean", "mean"], ...[...Array(body.heads).keys()].map((i) => [String(i), `${i + 1}`])], true);
    $("controls").hidden = false;
    $("status").textContent = `${body.source_pieces.length} source \u00d7 ${body.target_pieces.length} target pieces (greedy decoding)`;
    render();
  } catch (err) {
    if (ticket !== pending) return;
    $("status").textContent = `error: ${err.message}`;
    $("status").className = "error";
  }
}

$("form").addEventListener("submit", (event) => {
  event.preventDefault();
  clearTimeout(timer);
  explore();
});
$("source").addEventListener("input", () => {
  clearTimeout(timer);
  timer = setTimeout(explore, 500);
});
$("layer").addEventListener("change", () => { $("layer").dataset.touched = "1"; render(); });
$("head").addEventListener("change", render);

function direction() {
  // {source, target} of the chosen direction ({} when the model has one)
  const value = $("direction").value;
  if ($("direction").hidden || !value) return {};
  const [source, target] = value.split("|");
  return { source, target };
}

$("direction").addEventListener("change", () => {
  $("pair").textContent = $("direction").selectedOptions[0].textContent;
  explore();
});

fetch("/languages").then((r) => r.json()).then((langs) => {
  // every (source, target) the model translates, in the order /languages lists them
  const name = (code) => (langs.find((l) => l.code === code) || { name: code }).name;
  const pairs = langs.flatMap((l) => l.targets.map((t) => [`${l.code}|${t}`, `${l.name} \u2192 ${name(t)}`]));
  if (pairs.length === 0) { $("pair").textContent = ""; return; }
  fillSelect($("direction"), pairs, false);
  $("direction").hidden = pairs.length < 2;
  $("pair").textContent = pairs[0][1];
}).catch(() => { $("pair").textContent = ""; });
