// Stand-ins for node's fs and buffer, which sentencepiece-js imports for its node loaders
// (index.html's import map). The page never calls them: it hands the model bytes over itself.
export const Buffer = undefined;
export default {};
