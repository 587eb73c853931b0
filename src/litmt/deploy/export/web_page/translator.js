// The offline translator: litmt's ONNX export (format=onnx; its files are described in
// docs/guide/ship.md) run by onnxruntime-web's single-threaded wasm backend, with sentencepiece
// (the C++ library compiled to wasm) for the ids, so the page's ids are python
// sentencepiece's. No DOM here: app.js draws the page.
//
// Shapes: S source tokens (pad excluded), L decoder layers, H heads, D head width, V target
// vocabulary, t target tokens so far. The page decodes one sentence at a time (batch 1).

import * as ort from "./vendor/ort.wasm.bundle.min.mjs";
import { SentencePieceProcessor } from "./vendor/sentencepiece.js";

const RUNTIME_WASM = "vendor/ort-wasm-simd-threaded.wasm"; // relative to the page
const FORMAT_VERSION = 1; // of config.json (litmt.deploy.export.onnx.FORMAT_VERSION)
const SPECIAL = 4; // ids 0..3 (pad, unk, bos, eos) are never text
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
  // responses arrive; 0 when the server sends no lengths).
  static async load(base, onProgress = () => {}) {
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
    ];
    const [wasm, enc, dec, srcModel, tgtModel] = await Promise.all(
      files.map((f) => (f ? track(f) : null)),
    );
    let pieces = tok.pieces || null; // the list itself, or the file holding {"pieces": [...]}
    if (typeof pieces === "string") pieces = (await fetchJson(base + pieces)).pieces;
    ort.env.wasm.wasmBinary = wasm.buffer; // fetched above, with the progress
    ort.env.wasm.numThreads = 1; // threads need cross-origin isolation a plain server lacks
    const options = { executionProviders: ["wasm"], graphOptimizationLevel: "all" };
    const encoder = await ort.InferenceSession.create(enc, options);
    const decoder = await ort.InferenceSession.create(dec, options);
    const srcSp = await loadSentencePiece(srcModel);
    const tgtSp = tgtModel ? await loadSentencePiece(tgtModel) : srcSp;
    return new OfflineTranslator(config, encoder, decoder, srcSp, tgtSp, pieces);
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

  // Greedy search on source ids `ids` (S,): the target ids without bos/eos (the forced tag of a
  // target-placement export first), as litmt's greedy_search with batch 1.
  async greedy(ids, tgt = null) {
    const { special_ids: sp, model, decoding } = this.config;
    const L = model.n_decoder_layers;
    const H = model.n_heads;
    const D = model.head_dim;
    const S = ids.length;
    const src = new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, S]);
    const { cross_k, cross_v } = await this.encoder.run({ src_ids: src }); // (L, 1, H, S, D)
    const tag = this.tagId(tgt);
    const prefix = tag !== null && this.config.tag_placement === "target" ? [tag] : [];
    const budget = outputBudget(S, decoding, model.max_positions, prefix.length);
    const minLen = decoding.min_len || 0;
    let selfK = new ort.Tensor("float32", new Float32Array(0), [L, 1, H, 0, D]); // (L, 1, H, t, D)
    let selfV = selfK;
    let token = sp.bos;
    const out = [];
    while (out.length < budget) {
      const step = await this.decoder.run({
        tokens: new ort.Tensor("int64", BigInt64Array.of(BigInt(token)), [1]),
        src_ids: src,
        cross_k,
        cross_v,
        self_k: selfK,
        self_v: selfV,
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
      selfK = step.new_self_k;
      selfV = step.new_self_v;
    }
    return out; // at the budget eos is forced: nothing more to run
  }

  // Translate one line: {ids (source), out (target ids), text, ms (encode to text)}; a blank
  // line gives "" without running the model, as in litmt's Translator.
  async translate(line, tgt = null) {
    const start = performance.now();
    const text = line.replace(CONTROL, "");
    if (!text.trim()) return { ids: [], out: [], text: "", ms: 0 };
    const ids = this.encode(text, tgt);
    const out = await this.greedy(ids, tgt);
    return { ids, out, text: this.detokenize(out), ms: performance.now() - start };
  }
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
