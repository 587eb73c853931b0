// The offline page: load the export in model/ with progress, then translate the textarea's
// lines one by one in this page (translator.js), showing each line's time as it arrives.
// body[data-state] is loading | ready | translating | done | error (the browser test waits on it).
import { OfflineTranslator } from "./translator.js";

const $ = (id) => document.getElementById(id);
const MODEL = "model/";
let translator = null;

function setState(state) {
  document.body.dataset.state = state;
}

function fail(error) {
  setState("error");
  $("load-status").textContent = `Error: ${error.message}`;
  $("load-status").className = "error";
  $("translate").disabled = true;
}

function megabytes(n) {
  return `${(n / 1e6).toFixed(1)} MB`;
}

function showProgress({ loaded, total }) {
  const bar = $("progress");
  bar.max = Math.max(total, 1);
  bar.value = loaded;
  const pct = total ? ` (${Math.floor((100 * loaded) / total)}%)` : "";
  const status = `loading the model: ${megabytes(loaded)} of ${megabytes(total)}${pct}`;
  $("load-status").textContent = status;
}

// "en → de" for target `lang`: the sources the export's directions pair with it.
function directionLabel(directions, lang) {
  const sources = directions.filter((d) => d.split("-").pop() === lang).map((d) => d.split("-")[0]);
  return `${sources.join("/")} \u2192 ${lang}`;
}

function showModel(t, bytes, seconds) {
  const c = t.config;
  const targets = t.targets();
  const select = $("target");
  if (targets.length > 1) {
    const labels = targets.map((lang) => directionLabel(c.directions, lang));
    select.replaceChildren(...targets.map((lang, i) => new Option(labels[i], lang)));
    select.hidden = false;
    $("pair").textContent = `${labels.join(", ")} \u00b7 runs in this page`;
  } else {
    $("pair").textContent = `${c.src_lang} \u2192 ${c.tgt_lang} \u00b7 runs in this page`;
  }
  const quant = c.quantization === "int8" ? ", int8" : "";
  $("load-status").textContent =
    `model loaded${quant}: ${megabytes(bytes)} in ${seconds.toFixed(1)} s`;
}

async function load() {
  const start = performance.now();
  let bytes = 0;
  translator = await OfflineTranslator.load(MODEL, (p) => {
    bytes = p.loaded;
    showProgress(p);
  });
  showModel(translator, bytes, (performance.now() - start) / 1000);
  $("translate").disabled = false;
  setState("ready");
}

function lineItem(text, result) {
  const li = document.createElement("li");
  const span = document.createElement("span");
  span.className = "text";
  span.textContent = result ? result.text : "";
  li.append(span);
  if (result) {
    li.dataset.srcIds = result.ids.join(" ");
    li.dataset.outIds = result.out.join(" ");
    li.dataset.ms = result.ms.toFixed(1);
    const ms = document.createElement("span");
    ms.className = "ms";
    ms.textContent = `${result.ms.toFixed(0)} ms`;
    li.append(ms);
  }
  li.title = text;
  return li;
}

async function translateAll(event) {
  event.preventDefault();
  const lines = $("source").value.split("\n");
  const target = $("target").hidden ? null : $("target").value;
  const output = $("output");
  output.replaceChildren();
  $("translate").disabled = true;
  setState("translating");
  const start = performance.now();
  let done = 0;
  for (const line of lines) {
    const text = line.trim();
    const result = text ? await translator.translate(text, target) : null;
    output.append(lineItem(line, result));
    done += result ? 1 : 0;
    $("summary").textContent = `translating: ${output.children.length} of ${lines.length} lines`;
    await new Promise((resolve) => setTimeout(resolve, 0)); // let the page paint
  }
  const seconds = (performance.now() - start) / 1000;
  const rate = seconds > 0 ? done / seconds : 0;
  $("summary").textContent =
    `${done} sentences in ${seconds.toFixed(2)} s \u00b7 ${rate.toFixed(1)} sentences/s`;
  $("summary").dataset.sentencesPerSecond = rate.toFixed(3);
  $("translate").disabled = false;
  setState("done");
}

$("form").addEventListener("submit", (event) => translateAll(event).catch(fail));
load().catch(fail);
