// The offline page's Web Worker: loads the export and translates here, so the page's own thread
// stays free for the user (app.js draws; translator.js decodes). Messages:
//   page -> worker  {type: "load", base, threads}
//                   {type: "translate", id, lines, target, beamSize, lengthPenalty}
//                   {type: "cancel", id}
//   worker -> page  {type: "progress", loaded, total}
//                   {type: "ready", config, targets, threads}
//                   {type: "line", id, index, result}   (each line as it is done, blank ones too)
//                   {type: "done", id, sentences, seconds} | {type: "cancelled", id, index}
//                   {type: "error", id, message}
import { Cancelled, OfflineTranslator } from "./translator.js";

let translator = null;
const cancelled = new Set(); // ids of translations the page cancelled

async function load({ base, threads }) {
  translator = await OfflineTranslator.load(
    base,
    (p) => postMessage({ type: "progress", ...p }),
    threads,
  );
  const c = translator.config;
  const config = {
    src_lang: c.src_lang,
    tgt_lang: c.tgt_lang,
    directions: c.directions || [],
    quantization: c.quantization,
    decoding: c.decoding,
  };
  postMessage({
    type: "ready",
    config,
    targets: translator.targets(),
    threads: translator.threads,
  });
}

async function translate({ id, lines, target, beamSize, lengthPenalty }) {
  const signal = {
    get aborted() {
      return cancelled.has(id);
    },
  };
  const start = performance.now();
  let sentences = 0;
  for (let index = 0; index < lines.length; index++) {
    const line = lines[index].trim();
    let result = null;
    try {
      if (line)
        result = await translator.translate(line, target, { beamSize, lengthPenalty }, signal);
    } catch (error) {
      if (!(error instanceof Cancelled)) throw error;
      postMessage({ type: "cancelled", id, index });
      cancelled.delete(id);
      return;
    }
    sentences += result ? 1 : 0;
    postMessage({ type: "line", id, index, result });
  }
  postMessage({ type: "done", id, sentences, seconds: (performance.now() - start) / 1000 });
}

let queue = Promise.resolve(); // one job at a time, in order
onmessage = ({ data }) => {
  if (data.type === "cancel") {
    cancelled.add(data.id);
    return;
  }
  const job = data.type === "load" ? load : translate;
  queue = queue
    .then(() => job(data))
    .catch((error) => postMessage({ type: "error", id: data.id, message: error.message }));
};
