// @ts-check
// The window's shared state: what more than one panel reads or changes. Everything else the app
// knows lives in Rust; each panel asks for it.

/** @typedef {import('./types.js').HistoryEntry} HistoryEntry */

export const state = {
  /** The chosen dataset's path, even if it failed to load. @type {string|null} */
  dataset: null,
  /** Whether a field of the run is missing or wrong. */
  invalid: true,
  planning: false,
  running: false,
  building: false,
  /** The run shown in the result and evaluate panels. @type {HistoryEntry|null} */
  entry: null,
  /** The run whose status the progress panel shows (Resume continues it). @type {HistoryEntry|null} */
  statusEntry: null,
  /** The run highlighted in the history. @type {string|null} */
  viewedId: null,
};
