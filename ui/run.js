// @ts-check
// The Run panel: the run's settings (fields as the app describes them), the presets that fill
// them, their validation (by the app: every message is its own) and the plan (a dry run in the
// worker). Also what a run request is made of, which other panels edit.

import * as api from './api.js';
import { $, debounce, errorText, formatBytes, formatClock, formatCount, h, setMessage } from './dom.js';
import { scheduleDatasetReload } from './dataset.js';
import { state } from './state.js';
import { updateButtons } from './steps.js';

/** @typedef {import('./types.js').FieldErrors} FieldErrors */
/** @typedef {import('./types.js').FormField} FormField */
/** @typedef {import('./types.js').Plan} Plan */
/** @typedef {import('./types.js').Preset} Preset */
/** @typedef {import('./types.js').TrainingDraft} TrainingDraft */
/** @typedef {import('./types.js').Startup} Startup */
/** @typedef {import('./types.js').TrainField} TrainField */
/** @typedef {import('./types.js').TrainSettings} TrainSettings */
/** @typedef {'dataset'|'checkpoint'|'tokenizer'} PathField */

/** @type {PathField[]} */
const PATH_FIELDS = ['dataset', 'checkpoint', 'tokenizer'];

/** The settings' fields, in display order. @type {FormField[]} */
let fields = [];
/** @type {Preset[]} */
let presets = [];
/** The last preset chosen (saved in the preferences). */
let chosenPreset = '';

/** The fields that show their own message; the app's other messages go beside Start. */
const validated = () => [...fields.map((field) => field.name), ...PATH_FIELDS, 'device'];

/**
 * What is typed into each setting's field, as typed: the app reads and checks it.
 * @returns {Partial<Record<TrainField, string>>}
 */
function typedSettings() {
  return Object.fromEntries(fields.map(({ name }) => [name, $(`field-${name}`).value]));
}

/**
 * The field's number, for comparing with a preset's; NaN when it holds none.
 * @param {TrainField} name
 */
function typedNumber(name) {
  const text = $(`field-${name}`).value.trim();
  return text === '' ? NaN : Number(text);
}

/** @param {TrainSettings} settings */
export function fillFields(settings) {
  for (const { name } of fields) $(`field-${name}`).value = String(settings[name]);
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
 * The run the fields describe now, for validation, planning and Start.
 * @returns {TrainingDraft}
 */
export function currentRun() {
  return {
    dataset: pathValue('dataset'),
    checkpoint: pathValue('checkpoint'),
    tokenizer: pathValue('tokenizer'),
    device: $('device-select').value,
    settings: typedSettings(),
  };
}

/** Remembers the base model, the device and the preset for the next launch. */
export async function savePreferences() {
  const preferences = {
    checkpoint: pathValue('checkpoint') || null,
    tokenizer: pathValue('tokenizer') || null,
    device: $('device-select').value,
    preset: chosenPreset,
  };
  try {
    await api.savePreferences(preferences);
    setMessage($('app-error'), null);
  } catch (error) {
    setMessage($('app-error'), `Could not save preferences: ${errorText(error)}`);
  }
}

let validateSeq = 0;
async function validate() {
  const seq = ++validateSeq;
  /** @type {FieldErrors} */
  let errors;
  try {
    errors = await api.validateTraining(currentRun());
  } catch (error) {
    errors = { request: errorText(error) };
  }
  if (seq === validateSeq) renderValidation(errors); // else a newer check is under way
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
  const own = validated();
  for (const field of own) {
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
  const others = Object.entries(errors).filter(([field]) => !own.includes(field));
  state.invalid = Object.keys(errors).length > 0;
  $('start-hint').textContent = others.length
    ? others.map(([, message]) => message).join(' ')
    : state.invalid ? 'Complete the fields noted above to start.' : '';
  updateButtons();
}

/**
 * One setting's number input, its id and bounds as the app describes the field.
 * @param {FormField} field
 */
function fieldInput({ name, label, whole, min, max, step }) {
  /** @type {Record<string, string>} */
  const bounds = {};
  if (min != null) bounds.min = String(min);
  if (max != null) bounds.max = String(max);
  const input = h('input', { type: 'number', id: `field-${name}`, 'data-kind': whole ? 'int' : 'float', ...bounds,
    step, 'aria-describedby': `error-${name}` });
  input.addEventListener('input', () => {
    runInputsChanged();
    if (name === 'max_len') scheduleDatasetReload();
  });
  return h('div', { class: 'field' }, h('label', { for: `field-${name}` }, label), input,
    h('p', { id: `error-${name}`, class: 'field-error', 'aria-live': 'polite' }));
}

// ---------- presets ----------

/** @param {Preset} preset */
function presetButton(preset) {
  const button = h('button', { type: 'button', id: `preset-${preset.name}`, class: 'preset',
    'data-preset': preset.name, 'aria-pressed': 'false', title: preset.description }, preset.label);
  button.addEventListener('click', () => applyPreset(preset));
  return button;
}

/** Marks the preset the fields match by value, if any, and says what it is for. */
function renderPresets() {
  const active = presets.find((preset) => fields.every(({ name }) => typedNumber(name) === preset.settings[name]));
  for (const preset of presets) {
    $(`preset-${preset.name}`).setAttribute('aria-pressed', String(preset === active));
  }
  $('preset-description').textContent = active ? active.description : 'Custom settings';
}

/** @param {Preset} preset */
function applyPreset(preset) {
  const oldMaxLen = typedNumber('max_len');
  chosenPreset = preset.name;
  fillFields(preset.settings);
  savePreferences();
  runInputsChanged();
  if (preset.settings.max_len !== oldMaxLen) scheduleDatasetReload();
}

/**
 * Lays out the settings' fields and the presets as the app describes them, filled with the
 * remembered preset (else the first, else the fields' defaults).
 * @param {Pick<Startup, 'training_fields'|'presets'|'preferences'>} startup
 */
export function showRunSettings({ training_fields, presets: offered, preferences }) {
  fields = training_fields;
  presets = offered;
  chosenPreset = preferences.preset;
  $('run-fields').replaceChildren(...fields.map(fieldInput));
  $('preset-description').before(...presets.map(presetButton));
  const preset = presets.find((p) => p.name === chosenPreset) ?? presets[0];
  fillFields(preset?.settings ?? /** @type {TrainSettings} */ (Object.fromEntries(
    fields.map((field) => [field.name, field.default]))));
}

// ---------- plan ----------

async function checkPlan() {
  state.planning = true;
  updateButtons();
  $('plan').textContent = 'Planning…';
  try {
    renderPlan(await api.planTraining(currentRun()));
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
  $('plan-button').addEventListener('click', checkPlan);
}
