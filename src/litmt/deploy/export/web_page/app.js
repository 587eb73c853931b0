// The offline page: a Web Worker (worker.js) loads the export in model/ and translates; this
// thread only draws, so the page answers the user while a long text is translated. Lines
// appear as they are done, with their time; Cancel stops between two decoder steps.
// body[data-state] is loading | ready | translating | done | cancelled | error (the browser
// test waits on it). ?threads=N asks for N wasm threads (default: up to 4 where the page is
// cross-origin isolated, else 1, said on the page).
const $ = (id) => document.getElementById(id);
const MODEL = "model/";
const MAX_THREADS = 4;
const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
let job = 0; // the id of the translation shown
let started = 0;
let loadStart = 0;
let loadedBytes = 0;

function setState(state) {
  document.body.dataset.state = state;
}

function fail(message) {
  setState("error");
  $("load-status").textContent = `Error: ${message}`;
  $("load-status").className = "error";
  $("translate").disabled = true;
  $("cancel").hidden = true;
}

function megabytes(n) {
  return `${(n / 1e6).toFixed(1)} MB`;
}

// wasm threads: SharedArrayBuffer needs a cross-origin isolated page (COOP + COEP headers).
function askedThreads() {
  if (!self.crossOriginIsolated) return 1;
  const asked = Number(new URLSearchParams(location.search).get("threads") || 0);
  return asked > 0 ? asked : Math.min(MAX_THREADS, navigator.hardwareConcurrency || 1);
}

// What the page says of its threads (`threads`: what onnxruntime-web runs on).
function threadsNote(threads) {
  if (!self.crossOriginIsolated) {
    return "1 thread: this server does not send the cross-origin isolation headers (HEADERS.md)";
  }
  return `${threads} thread${threads > 1 ? "s" : ""}`;
}

function showProgress({ loaded, total }) {
  loadedBytes = loaded;
  const bar = $("progress");
  bar.max = Math.max(total, 1);
  bar.value = loaded;
  const pct = total ? ` (${Math.floor((100 * loaded) / total)}%)` : "";
  $("load-status").textContent =
    `loading the model: ${megabytes(loaded)} of ${megabytes(total)}${pct}`;
}

// "en → de" for target `lang`: the sources the export's directions pair with it.
function directionLabel(directions, lang) {
  const sources = directions.filter((d) => d.split("-").pop() === lang).map((d) => d.split("-")[0]);
  return `${sources.join("/")} \u2192 ${lang}`;
}

function showModel({ config: c, targets, threads }, note) {
  const select = $("target");
  if (targets.length > 1) {
    const labels = targets.map((lang) => directionLabel(c.directions, lang));
    select.replaceChildren(...targets.map((lang, i) => new Option(labels[i], lang)));
    select.hidden = false;
    $("pair").textContent = `${labels.join(", ")} \u00b7 runs in this page`;
  } else {
    $("pair").textContent = `${c.src_lang} \u2192 ${c.tgt_lang} \u00b7 runs in this page`;
  }
  const beam = $("beam");
  const exported = Math.max(1, Number(c.decoding?.beam_size || 1));
  const sizes = [...new Set([1, 2, 4, 5, 8, exported])].sort((a, b) => a - b);
  beam.replaceChildren(
    ...sizes.map((k) => new Option(k === 1 ? "greedy" : `beam ${k}`, String(k))),
  );
  beam.value = String(exported); // the export's decoding settings: the server's translation
  beam.dataset.lengthPenalty = String(c.decoding?.length_penalty ?? 1.0);
  const quant = c.quantization === "int8" ? ", int8" : "";
  const seconds = (performance.now() - loadStart) / 1000;
  $("load-status").textContent =
    `model loaded${quant}: ${megabytes(loadedBytes)} in ${seconds.toFixed(1)} s \u00b7 ${note}`;
  document.body.dataset.threads = String(threads);
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

function translateAll(event) {
  event.preventDefault();
  const lines = $("source").value.split("\n");
  job += 1;
  $("output").replaceChildren();
  $("output").dataset.lines = String(lines.length);
  $("translate").disabled = true;
  $("cancel").hidden = false;
  setState("translating");
  started = performance.now();
  const beamSize = Number($("beam").value);
  const lengthPenalty = Number($("beam").dataset.lengthPenalty);
  const target = $("target").hidden ? null : $("target").value;
  worker.postMessage({ type: "translate", id: job, lines, target, beamSize, lengthPenalty });
  $("summary").textContent = `translating: 0 of ${lines.length} lines`;
  $("summary").dataset.source = JSON.stringify(lines);
}

function finish(state, text) {
  $("summary").textContent = text;
  $("translate").disabled = false;
  $("cancel").hidden = true;
  setState(state);
}

worker.onmessage = ({ data }) => {
  if (data.type === "progress") return showProgress(data);
  if (data.type === "ready") {
    showModel(data, threadsNote(data.threads));
    $("translate").disabled = false;
    return setState("ready");
  }
  if (data.type === "error") return fail(data.message);
  if (data.id !== job) return; // a cancelled translation's last message
  const lines = JSON.parse($("summary").dataset.source);
  if (data.type === "line") {
    $("output").append(lineItem(lines[data.index], data.result));
    $("summary").textContent = `translating: ${data.index + 1} of ${lines.length} lines`;
  } else if (data.type === "done") {
    const rate = data.seconds > 0 ? data.sentences / data.seconds : 0;
    $("summary").dataset.sentencesPerSecond = rate.toFixed(3);
    const beam = Number($("beam").value);
    const search = beam > 1 ? `beam ${beam}` : "greedy";
    finish(
      "done",
      `${data.sentences} sentences in ${data.seconds.toFixed(2)} s \u00b7 ${rate.toFixed(1)} sentences/s \u00b7 ${search}`,
    );
  } else if (data.type === "cancelled") {
    finish("cancelled", `cancelled after ${data.index} of ${lines.length} lines`);
  }
};
worker.onerror = (event) => fail(event.message || "the translation worker failed");

// How long the page takes to handle a key press while the worker translates (the browser test
// reads window.inputLagsMs): the time from the event's creation to its handler.
window.inputLagsMs = [];
$("source").addEventListener("keydown", (event) => {
  if (document.body.dataset.state === "translating") {
    window.inputLagsMs.push(performance.now() - event.timeStamp);
  }
});

$("form").addEventListener("submit", translateAll);
$("cancel").addEventListener("click", () => worker.postMessage({ type: "cancel", id: job }));
loadStart = performance.now();
worker.postMessage({
  type: "load",
  base: new URL(MODEL, location.href).href,
  threads: askedThreads(),
});
