// @ts-check
// Small DOM helpers and the formatters every panel shares.

/** @typedef {import('./types.js').Backend} Backend */
/** @typedef {import('./types.js').Generation} Generation */
/** @typedef {import('./types.js').TrainSettings} TrainSettings */

/**
 * The elements by id: index.html's (elements.d.ts, generated from the page), and those the steps make
 * themselves (model.js's rows of base models, train.js's fields), each as the element it is.
 * @typedef {{ [Id in keyof import('./elements.js').Elements]: HTMLElementTagNameMap[import('./elements.js').Elements[Id]] }
 *   & { [Id in `hub-${'status' | 'detail' | 'error'}-${Generation}`]: HTMLParagraphElement }
 *   & { [Id in `hub-progress-${Generation}`]: HTMLProgressElement }
 *   & { [Id in `field-${keyof TrainSettings}`]: HTMLInputElement }
 *   & { [Id in `error-${keyof TrainSettings}`]: HTMLParagraphElement }} ById
 */

/**
 * The element with `id`, typed as what it is: an id no element has, or an element used as another
 * kind, fails the type check.
 * @template {keyof ById} Id
 * @param {Id} id
 * @returns {ById[Id]}
 */
export const $ = (id) => /** @type {ById[Id]} */ (document.getElementById(id));

/** @param {unknown} error */
export const errorText = (error) =>
  typeof error === 'string' ? error : error instanceof Error ? error.message : String(error);

/**
 * Shows a message (string or caught error) in an element, hiding the element when there is none.
 * @param {HTMLElement} el
 * @param {unknown} message
 */
export function setMessage(el, message) {
  const text = message ? errorText(message) : '';
  el.textContent = text;
  el.hidden = !text;
}

/**
 * Sets a status line: its data-status (styling, tests) and its sentence.
 * @param {HTMLElement} el @param {string} status @param {string} text
 */
export function setStatus(el, status, text) {
  el.dataset.status = status;
  el.textContent = text;
}

/**
 * `fn`, called once calls have paused for `ms`.
 * @template {unknown[]} A
 * @param {(...args: A) => void} fn
 * @param {number} ms
 * @returns {(...args: A) => void}
 */
export function debounce(fn, ms) {
  /** @type {ReturnType<typeof setTimeout>|undefined} */
  let timer;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

/**
 * Creates an element with attributes and children (strings become text, never HTML).
 * @param {string} tag
 * @param {Record<string, string>} [attrs]
 * @param {...(Node|string|null|undefined)} children
 */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  node.append(.../** @type {(Node|string)[]} */ (children.filter((child) => child != null)));
  return node;
}

// ---------- formatters ----------

const BACKEND_LABELS = { auto: 'Automatic', cpu: 'CPU', cuda: 'CUDA', metal: 'Metal' };

/** @param {number|null|undefined} bytes */
export function formatBytes(bytes) {
  if (bytes == null) return 'unknown';
  const gib = bytes / 2 ** 30;
  return gib >= 1 ? `${gib.toFixed(1)} GiB` : `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

/** @param {number|null|undefined} n */
export const formatCount = (n) => (n == null ? '–' : Number(n).toLocaleString());

/** @param {number|null|undefined} x */
export const formatLoss = (x) => (x == null ? '–' : x.toFixed(3));

/**
 * m:ss or h:mm:ss
 * @param {number|null|undefined} seconds
 */
export function formatClock(seconds) {
  if (seconds == null || !Number.isFinite(seconds)) return '–';
  const total = Math.max(0, Math.round(seconds));
  const [hours, minutes, secs] = [Math.floor(total / 3600), Math.floor(total / 60) % 60, total % 60];
  /** @param {number} n */
  const pad = (n) => String(n).padStart(2, '0');
  return hours ? `${hours}:${pad(minutes)}:${pad(secs)}` : `${minutes}:${pad(secs)}`;
}

/** @param {number} seconds */
export const formatElapsed = (seconds) => (seconds < 60 ? `${seconds.toFixed(1)} s` : formatClock(seconds));

/** @param {number} unixSeconds */
export const formatDate = (unixSeconds) =>
  new Date(unixSeconds * 1000).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' });

/** @param {number} rate a fraction */
export const percent = (rate) => `${(100 * rate).toFixed(0)}%`;

/** @param {string|null|undefined} path */
export const basename = (path) => (path ? path.split(/[\\/]/).pop() ?? '' : '');

/** @param {Backend|'auto'|string} backend */
export const backendLabel = (backend) => BACKEND_LABELS[/** @type {keyof BACKEND_LABELS} */ (backend)] ?? backend;
