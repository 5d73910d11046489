// @ts-check
// What one step's panel tells another, so that no panel imports another: the few facts several
// panels read (each written by the one panel that owns it), and the events a panel announces for
// the others to hear. Everything else the app knows lives in Rust; each panel asks for it.

/** @typedef {import('./types.js').HistoryEntry} HistoryEntry */
/** @typedef {import('./types.js').DatasetReport} DatasetReport */
/** @typedef {import('./types.js').Opened} Opened */

export const state = {
  /** The chosen dataset's path, even if it failed to load (Data). @type {string|null} */
  dataset: null,
  /** The model fields as typed, and the device chosen (Model). */
  model: { checkpoint: '', tokenizer: '', device: 'auto' },
  /** The training's settings as typed, field by field (Train). @type {Record<string, string>} */
  settings: {},
  /** The preset last chosen, remembered between launches (Train). */
  preset: '',
  /** A training's worker is going (Train). */
  running: false,
  /** A build is going (Export). */
  building: false,
  /** The training shown in the Export and Evaluate panels. @type {HistoryEntry|null} */
  entry: null,
  /** The training highlighted in History. @type {string|null} */
  viewedId: null,
};

/**
 * What a panel announces, and what comes with it.
 * @typedef {object} News
 * @property {null} inputs Something a training is made of changed (Train checks it again).
 * @property {null} reportInputs Something the dataset's report depends on changed (Data reads it again).
 * @property {DatasetReport} report The dataset's report arrived (Evaluate's Try takes its first sample).
 * @property {string} suite An acceptance suite was generated at this path (Evaluate's Acceptance offers it).
 * @property {null} preferences A remembered choice changed (Model saves them).
 * @property {null} busy A training or a build started or ended (buttons follow).
 * @property {HistoryEntry|null} shown Another training is shown in Export and Evaluate.
 * @property {HistoryEntry} rebuilt The shown training's .cact was built or published.
 * @property {Opened} opened A past training was opened (Train shows its settings, chart and status).
 * @property {string} resume History's Resume on a training (Train continues it).
 * @property {null} history The list of trainings changed (History reads it again).
 */

const news = new EventTarget();

/**
 * Shows `entry` in the Export and Evaluate panels (or that there is no training to show).
 * @param {HistoryEntry|null} entry
 */
export function showEntry(entry) {
  state.entry = entry;
  tell('shown', entry);
}

/**
 * Announces `name` to every panel that hears it.
 * @template {keyof News} K
 * @param {K} name @param {News[K]} detail
 */
export function tell(name, detail) {
  news.dispatchEvent(new CustomEvent(name, { detail }));
}

/**
 * Calls `handler` with what comes with each `name` announced.
 * @template {keyof News} K
 * @param {K} name @param {(detail: News[K]) => void} handler
 */
export function hear(name, handler) {
  news.addEventListener(name, (event) => handler(/** @type {CustomEvent<News[K]>} */ (event).detail));
}
