// @ts-check
// The Train step: the training's settings (fields as the app describes them), the presets that fill
// them, their validation (by the app: every message is its own) and the plan (a dry run in the
// worker); then start, resume and cancel a training, and follow its channel (steps, loss chart,
// log) to its end, in the panel and in the strip under the steps.

import * as api from '../ground/api.js';
import { resetCancel, wireCancel } from '../ground/cancel.js';
import { $, backendLabel, debounce, errorText, formatBytes, formatClock, formatCount, formatElapsed, formatLoss, h,
  setMessage, setStatus } from '../ground/dom.js';
import { hear, showEntry, state, tell } from '../ground/state.js';
import { badgeTab, showTab } from '../ground/tabs.js';

/** @typedef {import('../ground/types.js').FieldErrors} FieldErrors */
/** @typedef {import('../ground/types.js').FormField} FormField */
/** @typedef {import('../ground/types.js').HistoryEntry} HistoryEntry */
/** @typedef {import('../ground/types.js').Opened} Opened */
/** @typedef {import('../ground/types.js').Plan} Plan */
/** @typedef {import('../ground/types.js').Preset} Preset */
/** @typedef {import('../ground/types.js').TrainingStatus} TrainingStatus */
/** @typedef {import('../ground/types.js').Startup} Startup */
/** @typedef {import('../ground/types.js').Event} TrainEvent */
/** @typedef {import('../ground/types.js').TrainingDraft} TrainingDraft */
/** @typedef {import('../ground/types.js').TrainingMessage} TrainingMessage */
/** @typedef {import('../ground/types.js').TrainSettings} TrainSettings */
/** @typedef {'dataset'|'checkpoint'|'tokenizer'} PathField */
/** @typedef {keyof TrainSettings} TrainField */
/** A setting's field, named for its key in the settings. @typedef {FormField & {name: TrainField}} SettingField */

/** @type {PathField[]} */
const PATH_FIELDS = ['dataset', 'checkpoint', 'tokenizer'];

/** The settings' fields, in display order. @type {SettingField[]} */
let fields = [];
/** @type {Preset[]} */
let presets = [];
/** Each preset's button, by the preset's name. @type {Map<string, HTMLElement>} */
let presetButtons = new Map();
/** Whether a field of the training is missing or wrong. */
let invalid = true;
let planning = false;
/** The training whose status the panel shows (Resume continues it). @type {HistoryEntry|null} */
let statusEntry = null;

/**
 * The fields that show their own message; the app's other messages go beside Start.
 * @returns {(TrainField | PathField | 'device')[]}
 */
const validated = () => [...fields.map((field) => field.name), ...PATH_FIELDS, 'device'];

/**
 * What is typed into each setting's field, as typed: the app reads and checks it.
 * @returns {Partial<Record<TrainField, string>>}
 */
function typedSettings() {
  state.settings = Object.fromEntries(fields.map(({ name }) => [name, typedText(name)]));
  return state.settings;
}

/**
 * A field's input: a switch's checkbox, else a number's text box.
 * @param {TrainField} name
 */
const fieldElement = (name) => $(`field-${name}`);

/**
 * What a field holds, as the app reads it: a switch as `true` or `false`, a number as typed.
 * @param {TrainField} name
 */
function typedText(name) {
  const input = fieldElement(name);
  return input.type === 'checkbox' ? String(input.checked) : input.value;
}

/**
 * The field's number, for comparing with a preset's; NaN when it holds none.
 * @param {TrainField} name
 */
function typedNumber(name) {
  const input = fieldElement(name);
  if (input.type === 'checkbox') return Number(input.checked);
  const text = input.value.trim();
  return text === '' ? NaN : Number(text);
}

/** @param {TrainSettings} settings */
function fillFields(settings) {
  for (const { name } of fields) {
    const input = fieldElement(name);
    if (input.type === 'checkbox') input.checked = settings[name] === true;
    else input.value = String(settings[name]);
  }
  typedSettings();
}

/**
 * A path of the training as it stands: the chosen dataset, or a model field's text.
 * @param {PathField} field
 * @returns {string}
 */
function pathValue(field) {
  return field === 'dataset' ? state.dataset ?? '' : state.model[field];
}

/**
 * The training the fields describe now, for validation, planning and Start.
 * @returns {TrainingDraft}
 */
function currentDraft() {
  return {
    dataset: pathValue('dataset'),
    checkpoint: pathValue('checkpoint'),
    tokenizer: pathValue('tokenizer'),
    device: state.model.device,
    settings: typedSettings(),
  };
}

/** Enables what the state allows: one training at a time, Start only for a valid one. */
function updateButtons() {
  $('start-button').disabled = invalid || state.running;
  $('plan-button').disabled = invalid || planning;
  $('cancel-button').disabled = !state.running;
  $('resume-button').hidden = state.running || !statusEntry?.resumable;
}

let validateSeq = 0;
async function validate() {
  const seq = ++validateSeq;
  /** @type {FieldErrors} */
  let errors;
  try {
    errors = await api.validateTraining(currentDraft());
  } catch (error) {
    errors = { request: errorText(error) };
  }
  if (seq === validateSeq) renderValidation(errors); // else a newer check is under way
}
const scheduleValidate = debounce(validate, 150);

/** Anything that goes into a training changed: the plan is stale, the presets and validation need a look. */
function inputsChanged() {
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
  const others = Object.entries(errors).filter(([field]) => !own.some((name) => name === field));
  invalid = Object.keys(errors).length > 0;
  $('start-hint').textContent = others.length
    ? others.map(([, message]) => message).join(' ')
    : invalid ? 'Complete the fields noted above to start.' : '';
  updateButtons();
}

/**
 * One setting's input as the app describes the field: a switch's checkbox, else a number's box with
 * its bounds.
 * @param {FormField} field
 */
function fieldInput({ name, label, kind, whole, min, max, step }) {
  /** @type {Record<string, string>} */
  const bounds = {};
  if (min != null) bounds.min = String(min);
  if (max != null) bounds.max = String(max);
  const input = kind === 'switch'
    ? h('input', { type: 'checkbox', id: `field-${name}`, 'aria-describedby': `error-${name}` })
    : h('input', { type: 'number', id: `field-${name}`, 'data-kind': whole ? 'int' : 'float', ...bounds,
      step, 'aria-describedby': `error-${name}` });
  input.addEventListener('input', () => {
    inputsChanged();
    if (name === 'max_len') tell('reportInputs', null);
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
  const active = presets.find((preset) => fields.every(({ name }) => typedNumber(name) === Number(preset.settings[name])));
  for (const [name, button] of presetButtons) button.setAttribute('aria-pressed', String(name === active?.name));
  $('preset-description').textContent = active ? active.description : 'Custom settings';
}

/** @param {Preset} preset */
function applyPreset(preset) {
  const oldMaxLen = typedNumber('max_len');
  state.preset = preset.name;
  fillFields(preset.settings);
  tell('preferences', null);
  inputsChanged();
  if (preset.settings.max_len !== oldMaxLen) tell('reportInputs', null);
}

/**
 * Lays out the settings' fields and the presets as the app describes them, filled with the
 * remembered preset (else the first, else the fields' defaults).
 * @param {Pick<Startup, 'training_fields'|'presets'|'preferences'>} startup
 */
export function showTrainingSettings({ training_fields, presets: offered, preferences }) {
  // The engine names each field for its key in the settings (`TrainSettings`).
  fields = /** @type {SettingField[]} */ (training_fields);
  presets = offered;
  state.preset = preferences.preset;
  $('settings-fields').replaceChildren(...fields.map(fieldInput));
  presetButtons = new Map(presets.map((preset) => [preset.name, presetButton(preset)]));
  $('preset-description').before(...presetButtons.values());
  const preset = presets.find((p) => p.name === state.preset) ?? presets[0];
  fillFields(preset?.settings ?? /** @type {TrainSettings} */ (Object.fromEntries(
    fields.map((field) => [field.name, field.default]))));
}

// ---------- plan ----------

async function checkPlan() {
  planning = true;
  updateButtons();
  $('plan').textContent = 'Planning…';
  try {
    renderPlan(await api.planTraining(currentDraft()));
  } catch (error) {
    $('plan').replaceChildren(h('p', { class: 'error' }, errorText(error)));
  } finally {
    planning = false;
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
    `This training needs about ${formatBytes(plan.memory_estimate_bytes)} but ${formatBytes(plan.memory_available_bytes)} ` +
    'is free: it may be stopped by the system. Lower the batch size or the maximum length.')];
  $('plan').replaceChildren(list, ...warning);
}

// ---------- the training in the worker ----------

const CHART_PLACEHOLDER = 'The loss chart appears once training starts.';

/**
 * The training's status line, in the panel and in the strip.
 * @param {TrainingStatus|'stopping'} status @param {string} text
 */
function setTrainingStatus(status, text) {
  setStatus($('training-status'), status, text);
  setStatus($('strip-status'), status, text);
}

/** @param {boolean} running */
function setRunning(running) {
  state.running = running;
  resetCancel($('cancel-button'));
  setMessage($('cancel-error'), null);
  updateButtons();
  tell('busy', null);
}

/**
 * @param {string|null} svg the chart's markup, drawn by the app
 * @param {string} [placeholder] what to say when there is none
 */
function setChart(svg, placeholder = CHART_PLACEHOLDER) {
  if (svg) $('loss-chart').innerHTML = svg; // SVG markup from our own Rust: trusted
  else $('loss-chart').replaceChildren(h('p', { class: 'muted' }, placeholder));
}

/** @param {number} done @param {number} total */
function renderSteps(done, total) {
  for (const bar of [$('progress'), $('strip-progress')]) {
    bar.max = Math.max(1, total);
    bar.value = done;
  }
  $('progress-text').textContent = `${done} / ${total} steps`;
}

/** @param {string} line */
function appendLog(line) {
  const pre = $('log-lines');
  pre.append(`${line}\n`);
  pre.scrollTop = pre.scrollHeight;
}

function resetProgress() {
  renderSteps(0, 0);
  $('step-loss').textContent = '';
  $('eta').textContent = '–';
  $('tokens-per-s').textContent = '–';
  $('log-lines').textContent = '';
  setChart(null);
}

/**
 * @param {HistoryEntry} entry
 * @param {string} [message] how the training ended, when its channel said
 */
function describeEntry(entry, message) {
  const took = entry.seconds != null ? ` in ${formatElapsed(entry.seconds)}` : '';
  const validation = entry.final_val != null ? `, validation ${formatLoss(entry.final_val)}` : '';
  const losses = entry.final_loss != null ? ` — final loss ${formatLoss(entry.final_loss)}${validation}` : '';
  switch (entry.status) {
    case 'finished': return `Finished${took}${losses}`;
    case 'stopped': return `Stopped after ${entry.steps_done} / ${entry.steps} steps${took}${losses}`;
    case 'failed': return message ?? entry.message ?? 'The training failed.';
    case 'interrupted': return `Interrupted after ${entry.steps_done} / ${entry.steps} steps: ${entry.message}`;
    default: return 'Running…';
  }
}

/** @param {HistoryEntry} entry @param {string} [message] */
function renderEntryStatus(entry, message) {
  statusEntry = entry;
  setTrainingStatus(entry.status, describeEntry(entry, message));
  renderSteps(entry.steps_done, entry.steps);
  updateButtons();
}

/**
 * Starts a training (fresh: the panel starts empty) or resumes one; its messages arrive on a channel.
 * @param {(onEvent: (message: TrainingMessage) => void) => Promise<HistoryEntry>} launch
 * @param {boolean} fresh
 */
async function trainInWorker(launch, fresh) {
  if (fresh) resetProgress();
  showEntry(null);
  statusEntry = null;
  setRunning(true);
  setTrainingStatus('running', 'Starting…');
  try {
    const entry = await launch(handleTrainingMessage);
    state.viewedId = entry.id;
    tell('history', null);
  } catch (error) {
    setRunning(false);
    setTrainingStatus('failed', errorText(error));
  }
}

const startTraining = () => trainInWorker((onEvent) => api.startTraining(currentDraft(), onEvent), true);

/**
 * Continues a training that ended early from its saved state; its chart goes on where it stopped.
 * @param {string} id
 */
async function resumeTraining(id) {
  try {
    // The training's own chart and status, which the resumed steps carry on.
    const opened = await api.openTraining(id);
    tell('opened', opened);
    showEntry(opened.entry);
  } catch (error) {
    setTrainingStatus('failed', errorText(error));
    return;
  }
  $('log-lines').textContent = '';
  showTab('train');
  await trainInWorker((onEvent) => api.resumeTraining(id, onEvent), false);
}

/**
 * A past training, opened: its settings, chart and status.
 * @param {Opened} opened
 */
function showOpened({ entry, chart }) {
  fillFields(entry.request.settings);
  inputsChanged();
  setChart(chart, 'No loss chart was recorded for this training.');
  renderEntryStatus(entry);
}

/** @param {TrainingMessage} message */
function handleTrainingMessage(message) {
  switch (message.kind) {
    case 'progress':
      handleTrainEvent(message);
      break;
    case 'chart':
      setChart(message.svg);
      break;
    case 'log':
      appendLog(message.line);
      break;
    case 'finished':
      trainingEnded(message.entry);
      break;
    case 'failed':
      trainingEnded(message.entry, message.message);
      break;
  }
}

/**
 * The worker's own events, passed on as they are.
 * @param {TrainEvent} event
 */
function handleTrainEvent(event) {
  switch (event.event) {
    case 'started': {
      if (!state.running) break; // a late message from a training that already ended
      const where = `${backendLabel(event.backend)} (${event.device})`;
      const text = `Training on ${where}: ${formatCount(event.examples)} examples, ${formatCount(event.validation)} ` +
        `held out, sequence length ${event.seq_len}, est. peak memory ${formatBytes(event.memory_estimate_bytes)}`;
      if ($('training-status').dataset.status === 'running') setTrainingStatus('running', text);
      renderSteps(event.first_step, event.steps);
      appendLog(`${text}; ${event.steps} steps, ${event.warmup} warm-up`);
      break;
    }
    case 'step':
      renderSteps(event.step, event.total);
      $('step-loss').textContent = `loss ${formatLoss(event.loss)} · lr ${event.lr.toExponential(1)}`;
      $('eta').textContent = formatClock(event.eta_s);
      $('tokens-per-s').textContent = formatCount(Math.round(event.tokens_per_s));
      break;
    case 'epoch': {
      const validation = event.val != null ? `, validation ${formatLoss(event.val)}` : '';
      appendLog(`Epoch ${event.epoch}: loss ${formatLoss(event.loss)}${validation}`);
      break;
    }
  }
}

/** @param {HistoryEntry} entry @param {string} [message] */
function trainingEnded(entry, message) {
  setRunning(false);
  state.viewedId = entry.id;
  renderEntryStatus(entry, message);
  showEntry(entry);
  badgeTab('evaluate', entry.scores ? '•' : null);
  if (message) appendLog(message);
  tell('history', null);
}

export function wireTrain() {
  $('plan-button').addEventListener('click', checkPlan);
  $('start-button').addEventListener('click', startTraining);
  wireCancel($('cancel-button'), {
    cancel: api.cancelTraining,
    stopping: 'Stopping after this step…',
    say: (text) => setTrainingStatus('stopping', text),
    failed: (error) => setMessage($('cancel-error'), error),
    idle: () => setRunning(false),
  });
  $('resume-button').addEventListener('click', () => statusEntry && resumeTraining(statusEntry.id));
  hear('inputs', inputsChanged);
  hear('resume', resumeTraining);
  hear('opened', showOpened);
  updateButtons();
}
