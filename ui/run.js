// @ts-check
// The Run panel: the run's settings, the presets that fill them, their validation (by the app) and
// the plan (a dry run in the worker). Also what a run request is made of, which other panels edit.

import * as api from './api.js';
import { $, debounce, errorText, formatBytes, formatClock, formatCount, h, setMessage } from './dom.js';
import { scheduleDatasetReload } from './dataset.js';
import { state } from './state.js';
import { updateButtons } from './steps.js';

/** @typedef {import('./types.js').FieldErrors} FieldErrors */
/** @typedef {import('./types.js').Plan} Plan */
/** @typedef {import('./types.js').RunDraft} RunDraft */
/** @typedef {import('./types.js').RunField} RunField */
/** @typedef {import('./types.js').RunSettings} RunSettings */

/** @type {RunField[]} */
const FIELDS = ['epochs', 'lr', 'rank', 'alpha', 'batch_size', 'max_len', 'val_split', 'seed'];
/** @typedef {'dataset'|'checkpoint'|'tokenizer'} PathField */
/** @type {PathField[]} */
const PATH_FIELDS = ['dataset', 'checkpoint', 'tokenizer'];
/** The fields that show their own message; the app's other messages go beside Start. */
const VALIDATED = [...FIELDS, ...PATH_FIELDS, 'device'];

/**
 * Reads the run fields: numbers for the valid ones, a message for the rest.
 * @returns {{settings: Partial<RunSettings>, errors: FieldErrors}}
 */
export function readSettings() {
  /** @type {Partial<RunSettings>} */
  const settings = {};
  /** @type {FieldErrors} */
  const errors = {};
  for (const field of FIELDS) {
    const input = $(`field-${field}`);
    const raw = input.value.trim();
    const value = Number(raw);
    if (raw === '' || !Number.isFinite(value)) errors[field] = 'Enter a number.';
    else if (input.dataset.kind === 'int' && !Number.isInteger(value)) errors[field] = 'Enter a whole number.';
    else settings[field] = value;
  }
  return { settings, errors };
}

/** @param {RunSettings} settings */
export function fillFields(settings) {
  for (const field of FIELDS) $(`field-${field}`).value = String(settings[field]);
}

/**
 * A path of the run as it stands: the chosen dataset, or a model field's text.
 * @param {PathField} field
 * @returns {string}
 */
export function pathValue(field) {
  return field === 'dataset' ? state.dataset ?? '' : $(`${field}-path`).value.trim();
}

/**
 * The run as the fields describe it, for validation, planning and Start.
 * @param {Partial<RunSettings>} settings
 * @returns {RunDraft}
 */
function runRequest(settings) {
  return {
    dataset: pathValue('dataset'),
    checkpoint: pathValue('checkpoint'),
    tokenizer: pathValue('tokenizer'),
    device: $('device-select').value,
    settings,
  };
}

/** The run the fields describe now. */
export const currentRun = () => runRequest(readSettings().settings);

/** Remembers the base model, the device and the preset for the next launch. */
export async function saveSettings() {
  const settings = {
    checkpoint: pathValue('checkpoint') || null,
    tokenizer: pathValue('tokenizer') || null,
    device: $('device-select').value,
    preset: state.preset,
  };
  try {
    await api.saveSettings(settings);
    setMessage($('app-error'), null);
  } catch (error) {
    setMessage($('app-error'), `Could not save settings: ${errorText(error)}`);
  }
}

let validateSeq = 0;
async function validate() {
  const seq = ++validateSeq;
  const { settings, errors } = readSettings();
  /** @type {FieldErrors} */
  let serverErrors = {};
  if (Object.keys(errors).length === 0) {
    try {
      serverErrors = await api.validateRun(runRequest(settings));
    } catch (error) {
      serverErrors = { request: errorText(error) };
    }
    if (seq !== validateSeq) return; // a newer check is under way
  }
  renderValidation({ ...serverErrors, ...errors });
}
const scheduleValidate = debounce(validate, 150);

/** Anything that goes into a run changed: the plan is stale, the presets and validation need a look. */
export function runInputsChanged() {
  $('plan').replaceChildren();
  renderPresets();
  scheduleValidate();
}

/** @param {FieldErrors} errors */
function renderValidation(errors) {
  for (const field of VALIDATED) {
    const message = errors[field] ?? '';
    const errorEl = $(`error-${field}`);
    // An empty path is a to-do rather than a mistake: say so quietly, without a red outline.
    const isTodo = PATH_FIELDS.some((path) => path === field && !pathValue(path));
    setMessage(errorEl, message);
    errorEl.classList.toggle('hint', isTodo);
    const input = document.querySelector(`[aria-describedby~="error-${field}"]`);
    if (message && !isTodo) input?.setAttribute('aria-invalid', 'true');
    else input?.removeAttribute('aria-invalid');
  }
  const others = Object.entries(errors).filter(([field]) => !VALIDATED.includes(field));
  state.invalid = Object.keys(errors).length > 0;
  $('start-hint').textContent = others.length
    ? others.map(([, message]) => message).join(' ')
    : state.invalid ? 'Complete the fields noted above to start.' : '';
  updateButtons();
}

// ---------- presets ----------

/** Marks the preset the fields match, if any, and says what it is for. */
function renderPresets() {
  const { settings } = readSettings();
  const active = state.presets.find((preset) => FIELDS.every((f) => preset.settings[f] === settings[f]));
  for (const preset of state.presets) {
    const button = $(`preset-${preset.name}`);
    if (!button) continue;
    button.textContent = preset.label;
    button.title = preset.description;
    button.setAttribute('aria-pressed', String(preset === active));
  }
  $('preset-description').textContent = active ? active.description : 'Custom settings';
}

/** @param {string} name */
function applyPreset(name) {
  const preset = state.presets.find((p) => p.name === name);
  if (!preset) return;
  const oldMaxLen = readSettings().settings.max_len;
  state.preset = name;
  fillFields(preset.settings);
  saveSettings();
  runInputsChanged();
  if (preset.settings.max_len !== oldMaxLen) scheduleDatasetReload();
}

// ---------- plan ----------

async function checkPlan() {
  state.planning = true;
  updateButtons();
  $('plan').textContent = 'Planning…';
  try {
    renderPlan(await api.planRun(currentRun()));
  } catch (error) {
    $('plan').replaceChildren(h('p', { class: 'error' }, errorText(error)));
  } finally {
    state.planning = false;
    updateButtons();
  }
}

/** @param {Plan} plan */
function renderPlan(plan) {
  const rows = [
    ['Steps', `${formatCount(plan.steps)} (${formatCount(plan.steps_per_epoch)} per epoch), ${plan.warmup} warm-up`],
    ['Sequence length', `${formatCount(plan.seq_len)} tokens`],
    ['Examples', `${formatCount(plan.examples)}, ${formatCount(plan.validation)} held out for validation`],
    ['Trainable parameters',
      `${formatCount(plan.trainable_parameters)} in ${formatCount(plan.adapted_weights)} adapted weights`],
    ['Estimated peak memory', formatBytes(plan.memory_estimate_bytes) +
      (plan.recompute ? ' (activations recomputed layer by layer)' : '')],
  ];
  if (plan.seconds_estimate != null) rows.push(['Estimated time', formatClock(plan.seconds_estimate)]);
  const fits = plan.memory_available_bytes == null || plan.memory_estimate_bytes <= plan.memory_available_bytes;
  const list = h('dl', {}, ...rows.flatMap(([term, value]) => [h('dt', {}, term), h('dd', {}, value)]));
  const warning = fits ? [] : [h('p', { class: 'error', role: 'alert' },
    `This run needs about ${formatBytes(plan.memory_estimate_bytes)} but ${formatBytes(plan.memory_available_bytes)} ` +
    'is free: it may be stopped by the system. Lower the batch size or the maximum length.')];
  $('plan').replaceChildren(list, ...warning);
}

export function wireRun() {
  for (const button of document.querySelectorAll('.preset')) {
    button.addEventListener('click', () => applyPreset(/** @type {HTMLElement} */ (button).dataset.preset ?? ''));
  }
  for (const field of FIELDS) {
    $(`field-${field}`).addEventListener('input', () => {
      runInputsChanged();
      if (field === 'max_len') scheduleDatasetReload();
    });
  }
  $('plan-button').addEventListener('click', checkPlan);
}
