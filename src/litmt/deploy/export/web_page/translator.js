// The offline translator: litmt's ONNX export (format=onnx; its files are described in
// docs/guide/ship.md) run by onnxruntime-web's wasm backend (multi-threaded where the page is
// cross-origin isolated), with sentencepiece (the C++ library compiled to wasm) for the ids, so
// the page's ids are python sentencepiece's. No DOM here: worker.js runs it in a Web Worker and
// app.js draws the page.
//
// The searches are litmt's, with the same rules (litmt.decoding.search): greedy
// (greedy_search) and beam search (beam_search: GNMT length penalty, output budgets, min_len,
// a forced target-language tag, the stop test, n-best ranking), one sentence at a time.
//
// Shapes: S source tokens (pad excluded), L decoder layers, H heads, D head width, V target
// vocabulary, t target tokens so far, R decoder rows (1, or the beam's K).

import * as ort from "./vendor/ort.wasm.bundle.min.mjs";
import { SentencePieceProcessor } from "./vendor/sentencepiece.js";

const RUNTIME_WASM = "vendor/ort-wasm-simd-threaded.wasm"; // relative to the page
const FORMAT_VERSION = 6; // of config.json (litmt.deploy.export.onnx.FORMAT_VERSION)
const SPECIAL = 4; // ids 0..3 (pad, unk, bos, eos) are never text
const YIELD_EVERY = 8; // decoder steps between two looks at the message queue (a cancel)
// Control characters but tab, removed from input as litmt.data.text.clean_line does.
const CONTROL = /[\u0000-\u0008\u000A-\u001F\u007F-\u009F]/g;

async function fetchOk(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response;
}

async function fetchJson(url) {
  return (await fetchOk(url)).json();
}

// Fetch `url`: onTotal(Content-Length) once the headers are in, then onBytes(delta) as its body
// arrives; resolves to the body's bytes.
async function fetchBytes(url, onTotal, onBytes) {
  const response = await fetchOk(url);
  onTotal(Number(response.headers.get("Content-Length") || 0));
  const reader = response.body.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    size += value.length;
    onBytes(value.length);
  }
  const out = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

// The output budget of every litmt engine (litmt.decoding.search.rules.output_budgets):
// min(max(floor(a * S + b), floor), max_positions - 1), at least 0.
export function outputBudget(srcLen, decoding, maxPositions, floor = 0) {
  const budget = Math.max(Math.floor(srcLen * decoding.max_len_a + decoding.max_len_b), floor);
  return Math.max(0, Math.min(budget, maxPositions - 1));
}

// The GNMT length penalty ((5 + n) / 6) ** alpha (litmt.decoding.search.rules.length_penalty_factor).
export function lengthPenalty(n, alpha) {
  return Math.pow((5 + n) / 6, alpha);
}

// The search was cancelled (OfflineTranslator.translate's `signal`).
export class Cancelled extends Error {
  constructor() {
    super("cancelled");
    this.name = "Cancelled";
  }
}

// Let the event loop run (a worker's "cancel" message) between two decoder steps: a message
// port round trip, not setTimeout, whose nested calls are clamped to 4 ms.
function nextTask() {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => resolve();
    channel.port2.postMessage(null);
  });
}

async function loadSentencePiece(bytes) {
  const sp = new SentencePieceProcessor();
  // the package's loader takes a file path (node) or base64; its _loadModel takes the bytes
  // (pinned in web/package.json, so this name cannot move under us)
  await sp._loadModel(bytes);
  return sp;
}

export class OfflineTranslator {
  // Use `OfflineTranslator.load(base)`.
  constructor(config, encoder, decoder, srcSp, tgtSp, pieces) {
    this.config = config;
    // the decoder's self-attention cache inputs (self_k_i..., self_v_i...), in config order
    this.pastNames = config.inputs.decoder.filter((name) => name.startsWith("self_"));
    this.encoder = encoder;
    this.decoder = decoder;
    this.srcSp = srcSp;
    this.tgtSp = tgtSp;
    this.pieces = pieces; // an imported model's piece list (id -> piece), or null
    this.pieceIds = pieces ? new Map(pieces.map((p, i) => [p, i])) : null;
    this.langTagIds = new Set(config.lang_tag_ids || []);
  }

  // The export at `base` (a URL folder ending in "/") and the runtime, with progress:
  // onProgress({loaded, total}) in bytes over every file fetched (total may grow while
  // responses arrive; 0 when the server sends no lengths). `threads`: onnxruntime-web's wasm
  // threads (they need a cross-origin isolated page: `availableThreads`).
  static async load(base, onProgress = () => {}, threads = 1) {
    const config = await fetchJson(`${base}config.json`);
    if (config.format !== "litmt-onnx") {
      throw new Error(`${base}config.json is not a litmt ONNX export (format=onnx)`);
    }
    if (config.format_version !== FORMAT_VERSION) {
      const v = config.format_version;
      throw new Error(`${base} is ONNX export format ${v}; this page reads ${FORMAT_VERSION}`);
    }
    const tok = config.tokenizer;
    const state = { loaded: 0, total: 0 };
    const track = (url) =>
      fetchBytes(
        url,
        (n) => {
          state.total += n;
          onProgress({ ...state });
        },
        (n) => {
          state.loaded += n;
          onProgress({ ...state });
        },
      );
    const files = [
      RUNTIME_WASM,
      base + config.files.encoder,
      base + config.files.decoder,
      base + tok.src_model,
      tok.tgt_model ? base + tok.tgt_model : null,
      config.files.shared ? base + config.files.shared : null,
    ];
    const [wasm, enc, dec, srcModel, tgtModel, shared] = await Promise.all(
      files.map((f) => (f ? track(f) : null)),
    );
    let pieces = tok.pieces || null; // the list itself, or the file holding {"pieces": [...]}
    if (typeof pieces === "string") pieces = (await fetchJson(base + pieces)).pieces;
    ort.env.wasm.wasmBinary = wasm.buffer; // fetched above, with the progress
    ort.env.wasm.numThreads = threads; // > 1 only where SharedArrayBuffer exists
    const options = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
    if (shared) {
      // the weights both graphs hold, fetched once (litmt.deploy.export.onnx.share_weights)
      options.externalData = [{ path: config.files.shared, data: shared }];
    }
    const encoder = await ort.InferenceSession.create(enc, options);
    const decoder = await ort.InferenceSession.create(dec, options);
    const srcSp = await loadSentencePiece(srcModel);
    const tgtSp = tgtModel ? await loadSentencePiece(tgtModel) : srcSp;
    const t = new OfflineTranslator(config, encoder, decoder, srcSp, tgtSp, pieces);
    t.threads = ort.env.wasm.numThreads; // onnxruntime-web sets 1 where threads cannot run
    return t;
  }

  // Target languages a user may choose (multilingual exports), in the export's order.
  targets() {
    const seen = [];
    for (const d of this.config.directions || []) {
      const tgt = d.split("-").pop();
      if (!seen.includes(tgt)) seen.push(tgt);
    }
    return seen;
  }

  // Source ids of `text` for target language `tgt` (null: the model's one direction), as
  // litmt's Tokenizer.encode_src plus the language tag (config.json, export spec).
  encode(text, tgt = null) {
    const tok = this.config.tokenizer;
    let ids;
    if (this.pieceIds) {
      ids = this.srcSp.encodePieces(text).map((p) => this.pieceIds.get(p) ?? 1);
    } else {
      ids = this.srcSp.encodeIds(text);
    }
    if (tok.src_eos) ids.push(this.config.special_ids.eos);
    const tag = this.tagId(tgt);
    if (tag !== null && this.config.tag_placement === "source") ids.unshift(tag);
    return ids.slice(0, this.config.model.max_positions);
  }

  // The target-language tag id for `tgt`, or null for a one-direction export.
  tagId(tgt) {
    if (!this.config.tag_placement) return null;
    const lang = tgt ?? this.targets()[0];
    const id = (this.config.tags || {})[`<2${lang}>`];
    if (id === undefined) throw new Error(`the export has no tag for target language ${lang}`);
    return id;
  }

  // Text of target ids: eos/pad/bos and language tags dropped, then sentencepiece's decode
  // (an imported model's piece list: its pieces joined, ▁ read as a space).
  detokenize(ids) {
    const kept = ids.filter((i) => i >= SPECIAL || i === 1).filter((i) => !this.langTagIds.has(i));
    if (this.pieces) {
      const text = kept.filter((i) => i >= SPECIAL).map((i) => this.pieces[i]);
      return text.join("").replaceAll("\u2581", " ").trim();
    }
    return this.tgtSp.decodeIds(kept);
  }

  // What both searches start from: the source ids as a (1, S) tensor, the encoder's
  // cross-attention keys/values by input name (cross_k_i, cross_v_i: (1, H, S, D) each), the
  // forced target prefix (the tag of a target-placement export), the output budget, min_len
  // and the empty self-attention cache by input name (self_k_i, self_v_i: (1, H, 0, D)).
  async start(ids, tgt) {
    const { model, decoding } = this.config;
    const src = new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]);
    const encoded = await this.encoder.run({ src_ids: src });
    const cross = {};
    for (const name of this.config.outputs.encoder) cross[name] = encoded[name];
    const tag = this.tagId(tgt);
    const prefix = tag !== null && this.config.tag_placement === "target" ? [tag] : [];
    const budget = outputBudget(ids.length, decoding, model.max_positions, prefix.length);
    const shape = [1, model.n_heads, 0, model.head_dim];
    const empty = new ort.Tensor("float32", new Float32Array(0), shape);
    const past = {};
    for (const name of this.pastNames) past[name] = empty;
    return { src, cross, prefix, budget, minLen: decoding.min_len || 0, past };
  }

  // A step's new cache (new_self_k_i..., new_self_v_i... (R0, H, P, D)) as the next step's
  // cache inputs (self_k_i..., self_v_i...): as it came out, or its rows `beams` (R,) in that
  // order (a beam search's reorder; the graph only appends). A row (H, P, D) is one
  // contiguous block of the tensor, copied as it is; the same rows in the same order are
  // passed on uncopied.
  nextPast(out, beams = null) {
    const past = {};
    for (const name of this.pastNames) {
      const cache = out[`new_${name}`];
      const [rows, heads, len, dim] = cache.dims;
      if (beams === null || (beams.length === rows && beams.every((j, r) => j === r))) {
        past[name] = cache;
        continue;
      }
      const size = heads * len * dim;
      const data = new Float32Array(beams.length * size);
      beams.forEach((j, r) => data.set(cache.data.subarray(j * size, (j + 1) * size), r * size));
      past[name] = new ort.Tensor("float32", data, [beams.length, heads, len, dim]);
    }
    return past;
  }

  // Greedy search on source ids `ids` (S,): the target ids without bos/eos (the forced tag of a
  // target-placement export first), as litmt's greedy_search with batch 1.
  async greedy(ids, tgt = null, signal = null) {
    const sp = this.config.special_ids;
    const { src, cross, prefix, budget, minLen, past: empty } = await this.start(ids, tgt);
    let past = empty; // self_k_i/self_v_i (1, H, t, D)
    let token = sp.bos;
    const out = [];
    while (out.length < budget) {
      await checkpoint(out.length, signal);
      const step = await this.decoder.run({
        tokens: new ort.Tensor("int64", BigInt64Array.of(BigInt(token)), [1]),
        src_ids: src,
        ...cross,
        ...past,
      });
      let next;
      if (out.length < prefix.length) {
        next = prefix[out.length];
      } else {
        next = argmax(step.logits.data, out.length < minLen ? sp.eos : -1); // logits (1, V)
        if (next === sp.eos) break;
      }
      out.push(next);
      token = next;
      past = this.nextPast(step);
    }
    return out; // at the budget eos is forced: nothing more to run
  }

  // Beam search on source ids `ids` (S,) with `beamSize` beams, as litmt's beam_search with
  // batch 1 and its rules (litmt.decoding.search.beam): each step scores the K*V continuations
  // of the live beams and keeps the 2K best; eos candidates among the top K finish (kept by
  // GNMT score log P / lp(t + 1), the K best, ties in order of arrival), the K best others live
  // on; the search stops when K have finished, when the nBest-th finished beats what a live beam
  // can still reach (log P / lp(budget + 1) for alpha > 0, else at the next step), at the
  // budget, or with no live beam. Returns the nBest best [{tokens, score, logProb}], best first.
  async beam(ids, tgt = null, { beamSize, lengthPenalty: alpha, nBest = 1 }, signal = null) {
    const sp = this.config.special_ids;
    const K = beamSize;
    const V = this.config.model.tgt_vocab_size;
    const { src, cross, prefix, budget, minLen, past } = await this.start(ids, tgt);
    const lpMax = lengthPenalty(budget + 1, alpha);
    let rows = {
      src,
      cross,
      past,
    };
    let scores = [0]; // (kk,) cumulative log-probabilities of the live beams
    let history = [[]]; // (kk, t) their tokens
    let last = [sp.bos];
    let finished = []; // [{tokens, score, logProb}], best first, at most K
    for (let step = 0; step <= budget; step++) {
      await checkpoint(step, signal);
      const kk = scores.length;
      const out = await this.decoder.run({
        tokens: new ort.Tensor("int64", BigInt64Array.from(last, BigInt), [kk]),
        src_ids: rows.src,
        ...rows.cross,
        ...rows.past,
      });
      const logits = out.logits.data; // (kk, V)
      const top = []; // the 2K best candidates [value, beam, token], best first
      for (let j = 0; j < kk; j++) {
        const logp = logSoftmax(logits, j * V, V);
        applyRules(logp, step, minLen, budget, prefix, sp.eos);
        for (let v = 0; v < V; v++) pushTop(top, 2 * K, scores[j] + logp[v], j, v);
      }
      // finish: eos candidates among the top K
      const ended = [];
      for (const [value, j, v] of top.slice(0, K)) {
        if (v === sp.eos && value > -Infinity) {
          const lp = lengthPenalty(history[j].length + 1, alpha);
          ended.push({ tokens: history[j], score: value / lp, logProb: value });
        }
      }
      if (ended.length) finished = bestFirst([...finished, ...ended]).slice(0, K);
      // continue: the K best non-eos candidates, in rank order
      const live = top.filter(([, , v]) => v !== sp.eos).slice(0, K);
      scores = live.map(([value]) => value);
      last = live.map(([, , v]) => v);
      const beams = live.map(([, j]) => j);
      history = live.map(([, j, v]) => [...history[j], v]);
      rows = {
        src: rows.src, // one source for every beam: the graph reads it once for all kk rows
        cross: rows.cross,
        past: this.nextPast(out, beams), // row r continues beam beams[r]
      };
      // the stop test (beam_done)
      const bestLive = Math.max(...scores);
      const reachable = alpha > 0 ? bestLive / lpMax : bestLive / lengthPenalty(step + 2, alpha);
      const beats = finished.length >= nBest && finished[nBest - 1].score >= reachable;
      if (finished.length >= K || beats || step >= budget || bestLive === -Infinity) break;
    }
    return finished.slice(0, nBest);
  }

  // Translate one line: {ids (source), out (target ids), text, ms (encode to text)}; a blank
  // line gives "" without running the model, as in litmt's Translator. `beamSize` 1 is the
  // greedy search (the same result as beam search with K = 1, faster); `lengthPenalty` is the
  // beam's alpha. `signal` ({aborted}) cancels between two decoder steps (Cancelled).
  async translate(line, tgt = null, { beamSize = 1, lengthPenalty = 1.0 } = {}, signal = null) {
    const start = performance.now();
    const text = line.replace(CONTROL, "");
    if (!text.trim()) return { ids: [], out: [], text: "", ms: 0 };
    const ids = this.encode(text, tgt);
    let out;
    if (beamSize > 1) {
      const found = await this.beam(ids, tgt, { beamSize, lengthPenalty }, signal);
      out = found.length ? found[0].tokens : [];
    } else {
      out = await this.greedy(ids, tgt, signal);
    }
    return { ids, out, text: this.detokenize(out), ms: performance.now() - start };
  }
}

// Between two decoder steps: throw Cancelled once `signal.aborted`, and every YIELD_EVERY
// steps let the event loop deliver messages (the worker's cancel).
async function checkpoint(step, signal) {
  if (signal === null) return;
  if (step % YIELD_EVERY === 0) await nextTask();
  if (signal.aborted) throw new Cancelled();
}

// log_softmax of values[offset .. offset + n) (float32 logits) in float64, as a new array.
function logSoftmax(values, offset, n) {
  let max = -Infinity;
  for (let i = 0; i < n; i++) max = Math.max(max, values[offset + i]);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp(values[offset + i] - max);
  const lse = max + Math.log(sum);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = values[offset + i] - lse;
  return out;
}

// In place on one row's log-probabilities at `step` (litmt.decoding.search.rules.StepRules):
// no eos before minLen; only eos at the budget; inside the prefix only its token.
function applyRules(logp, step, minLen, budget, prefix, eos) {
  if (step < minLen) logp[eos] = -Infinity;
  if (step === budget) {
    for (let v = 0; v < logp.length; v++) if (v !== eos) logp[v] = -Infinity;
  }
  if (step < prefix.length) {
    for (let v = 0; v < logp.length; v++) if (v !== prefix[step]) logp[v] = -Infinity;
  }
}

// Insert candidate [value, beam, token] into `top` (best first, at most n); on equal values
// the earlier candidate (lower beam * V + token) ranks first.
function pushTop(top, n, value, beam, token) {
  if (top.length === n && !(value > top[n - 1][0])) return;
  let i = top.length;
  while (i > 0 && value > top[i - 1][0]) i--;
  top.splice(i, 0, [value, beam, token]);
  if (top.length > n) top.pop();
}

// Finished hypotheses by score, best first; a stable sort keeps the order of arrival on ties.
function bestFirst(hyps) {
  return hyps.slice().sort((a, b) => b.score - a.score);
}

// Index of the largest value (the first one on ties, as torch.argmax and numpy.argmax);
// `skip` (an id, or -1) is never chosen (eos before min_len).
function argmax(values, skip) {
  let best = -1;
  let bestValue = -Infinity;
  for (let i = 0; i < values.length; i++) {
    if (i !== skip && values[i] > bestValue) {
      bestValue = values[i];
      best = i;
    }
  }
  return best;
}
