// @ts-check
// The Model step: the hardware the engine picked and the device choice; the checkpoint and tokenizer
// fields; each published base model (Needle 3, Needle 2) from the hub — cached, or downloaded with a
// progress bar and Cancel — with its size; and the choices the app remembers between launches.

import * as api from '../ground/api.js';
import { $, backendLabel, basename, errorText, formatBytes, h, setMessage, setStatus } from '../ground/dom.js';
import { pickPath } from '../ground/files.js';
import { hear, state, tell } from '../ground/state.js';

/** @typedef {import('../ground/types.js').BackendInfo} BackendInfo */
/** @typedef {import('../ground/types.js').BaseModel} BaseModel */
/** @typedef {import('../ground/types.js').BaseModelOffer} BaseModelOffer */
/** @typedef {import('../ground/types.js').BaseModelStatus} BaseModelStatus */
/** @typedef {import('../ground/types.js').DownloadMessage} DownloadMessage */
/** @typedef {import('../ground/types.js').Generation} Generation */

// ---------- hardware ----------

/**
 * @param {BackendInfo} hardware
 * @param {string[]} devices the device selector's choices
 * @param {string} selected the remembered choice
 */
export function renderHardware(hardware, devices, selected) {
  const badge = $('backend-badge');
  badge.textContent = backendLabel(hardware.backend);
  badge.dataset.backend = hardware.backend;
  $('device-name').textContent = hardware.device;
  const free = hardware.memory_free_bytes != null ? `, ${formatBytes(hardware.memory_free_bytes)} free` : '';
  $('device-memory').textContent =
    hardware.memory_bytes != null ? `(${formatBytes(hardware.memory_bytes)}${free})` : '(memory unknown)';
  $('device-reason').textContent = hardware.reason;
  const select = $('device-select');
  select.replaceChildren(...devices.map((device) => h('option', { value: device }, backendLabel(device))));
  select.value = devices.includes(selected) ? selected : devices[0];
  state.model.device = select.value;
}

// ---------- preferences ----------

/** Remembers the base model, the device and the preset for the next launch. */
async function savePreferences() {
  const preferences = {
    checkpoint: state.model.checkpoint || null,
    tokenizer: state.model.tokenizer || null,
    device: state.model.device,
    preset: state.preset,
  };
  try {
    await api.savePreferences(preferences);
    setMessage($('app-error'), null);
  } catch (error) {
    setMessage($('app-error'), `Could not save preferences: ${errorText(error)}`);
  }
}

// ---------- base model ----------

/** The base models' status, as `base_model` last said. @type {BaseModelStatus|null} */
let hub = null;

/**
 * A model file's field and its Choose… button.
 * @param {'checkpoint'|'tokenizer'} name @param {string} label @param {string[]} ext
 */
function wireModelPath(name, label, ext) {
  const input = $(`${name}-path`);
  const typed = () => {
    state.model[name] = input.value.trim();
    tell('inputs', null);
  };
  const commit = () => {
    typed();
    savePreferences();
    if (hub) renderHub(hub);
    // The tokenizer counts the lengths; the checkpoint's generation decides how lines render.
    tell('reportInputs', null);
  };
  input.addEventListener('input', typed);
  input.addEventListener('change', commit);
  $(`${name}-choose`).addEventListener('click', async () => {
    const path = await pickPath({ name: label, ext, current: input.value.trim(), errorEl: $(`error-${name}`) });
    if (!path) return;
    input.value = path;
    commit();
  });
}

/**
 * Every published base model, one row each, and a line on the one in use.
 * @param {BaseModelStatus} status
 */
function renderHub(status) {
  hub = status;
  const busy = status.models.some((model) => model.download.state === 'running');
  $('hub-models').replaceChildren(...status.models.map((model) => hubRow(model, model.generation === status.chosen, busy)));
  renderTrouble(status.models);
  const inUse = status.models.find((model) => isInUse(model));
  $('hub-status').textContent = inUse
    ? `Using ${inUse.label} from the hub cache.`
    : state.model.checkpoint
      ? 'Using the checkpoint below.'
      : `No base model yet: download one (${status.models[0]?.label ?? 'Needle'} is the newest).`;
}

/**
 * What kept the hub from answering about the models not on this computer: "offline" (or that the hub
 * did not answer) in one line with Retry, each model's whole message folded away under Details.
 * @param {BaseModelOffer[]} models
 */
function renderTrouble(models) {
  const troubled = models.filter((model) => model.trouble && !model.cached);
  $('hub-trouble').hidden = troubled.length === 0;
  if (troubled.length === 0) return;
  const offline = troubled.every((model) => model.trouble?.offline);
  const inUse = state.model.checkpoint ? '; the checkpoint below works without it' : '';
  $('hub-trouble-line').dataset.status = offline ? 'offline' : 'failed';
  $('hub-trouble-line').textContent = offline
    ? `Offline: the model hub cannot be reached${inUse}.`
    : `The model hub did not answer${inUse}.`;
  $('hub-trouble-list').replaceChildren(...troubled.map((model) =>
    h('li', {}, h('strong', {}, `${model.label}: `), model.trouble?.details ?? '')));
}

/** @param {BaseModelOffer} model */
const isInUse = (model) => model.cached != null && state.model.checkpoint === model.cached.checkpoint;

/**
 * One base model: its name, size and state, and Download, Use and Cancel.
 * @param {BaseModelOffer} model @param {boolean} chosen @param {boolean} busy another download runs
 */
function hubRow(model, chosen, busy) {
  const id = (/** @type {string} */ part) => `hub-${part}-${model.generation}`;
  const { cached, download, label } = model;
  const running = download.state === 'running';
  const size = model.bytes != null ? formatBytes(model.bytes) : running ? '' : 'size unknown';
  const status = h('p', { id: id('status'), class: 'status', 'data-status': 'idle' });
  const detail = h('p', { id: id('detail'), class: 'muted small path' });
  // The chosen generation's Download is the panel's first action.
  const downloadButton = h('button', { type: 'button', id: id('download'), ...(chosen ? { class: 'primary' } : {}) },
    model.partial_bytes > 0 ? 'Resume download' : `Download ${label}`);
  const useButton = h('button', { type: 'button', id: id('use') }, `Use ${label}`);
  const progress = /** @type {HTMLProgressElement} */ (h('progress', { id: id('progress'), max: '1', value: '0' }));
  const cancel = h('button', { type: 'button', id: id('cancel') }, 'Cancel');
  const error = h('p', { id: id('error'), class: 'error', role: 'alert' });
  downloadButton.hidden = Boolean(cached) || running;
  downloadButton.toggleAttribute('disabled', busy);
  useButton.hidden = !cached || isInUse(model);
  progress.hidden = !running;
  cancel.hidden = !running;
  downloadButton.addEventListener('click', () => downloadBaseModel(model.generation));
  useButton.addEventListener('click', () => useCached(model.generation));
  cancel.addEventListener('click', cancelDownload);
  const row = h('li', { id: id('model'), class: 'hub-model', 'data-chosen': String(chosen) },
    h('div', { class: 'hub-model-head' },
      h('strong', {}, label),
      h('span', { class: 'muted small' }, model.repo),
      h('span', { id: id('size'), class: 'small' }, size),
      isInUse(model) ? h('span', { class: 'badge' }, 'In use') : null),
    status, detail, h('div', { class: 'actions' }, downloadButton, useButton, progress, cancel), error);
  if (download.state === 'running') {
    renderProgress({ status, detail, progress }, label, download.file, download.bytes, download.total, null);
  } else if (cached) {
    setStatus(status, 'cached', 'On this computer');
    detail.textContent = cached.checkpoint;
  } else {
    setStatus(status, 'idle', 'Not on this computer yet');
    const resume = model.partial_bytes > 0 ? `${formatBytes(model.partial_bytes)} already here; the download resumes` : '';
    detail.textContent = model.bytes != null ? resume : '';
  }
  const failed = download.state === 'failed' || download.state === 'cancelled';
  setMessage(error, failed && !cached ? download.message : null);
  return row;
}

/**
 * A row's elements that show a download's progress.
 * @typedef {{status: HTMLElement, detail: HTMLElement, progress: HTMLProgressElement}} ProgressParts
 */

/**
 * Draws a download's progress into its row.
 * @param {ProgressParts} parts @param {string} label @param {string} file @param {number} bytes
 * @param {number} total @param {number|null} rate bytes per second
 */
function renderProgress({ status, detail, progress }, label, file, bytes, total, rate) {
  setStatus(status, 'running', `Downloading ${basename(file) || label}…`);
  progress.hidden = false;
  progress.max = Math.max(1, total);
  progress.value = bytes;
  const speed = rate ? ` · ${formatBytes(rate)}/s` : '';
  detail.textContent = `${formatBytes(bytes)} of ${formatBytes(total)}${speed}`;
}

export async function refreshHub() {
  try {
    renderHub(await api.baseModel());
  } catch (error) {
    setMessage($('app-error'), error);
  }
}

/**
 * Fills the model fields with a published base model's files, which the app now remembers.
 * @param {BaseModel} base
 */
function showBaseModel(base) {
  showModelPaths(base);
  tell('inputs', null);
  tell('reportInputs', null);
}

/** @param {Generation} generation */
async function useCached(generation) {
  try {
    showBaseModel(await api.useBaseModel(generation));
    await refreshHub();
  } catch (error) {
    await refreshHub();
    setMessage($(`hub-error-${generation}`), error);
  }
}

/** @param {Generation} generation */
async function downloadBaseModel(generation) {
  if (hub) {
    const running = { state: /** @type {const} */ ('running'), file: '', bytes: 0, total: 0 };
    renderHub({
      ...hub,
      models: hub.models.map((model) => (model.generation === generation ? { ...model, download: running } : model)),
    });
  }
  const label = hub?.models.find((model) => model.generation === generation)?.label ?? 'the base model';
  /** @param {DownloadMessage} message */
  const onEvent = (message) => {
    if (message.kind === 'progress') {
      /** @type {ProgressParts} */
      const parts = {
        status: $(`hub-status-${generation}`),
        detail: $(`hub-detail-${generation}`),
        progress: $(`hub-progress-${generation}`),
      };
      if (message.event === 'started') {
        renderProgress(parts, label, message.file, message.resumed_from, message.total, null);
      } else if (message.event === 'progress') {
        renderProgress(parts, label, message.file, message.bytes, message.total, message.bytes_per_s);
      }
      return;
    }
    if (message.base) showBaseModel(message.base);
    refreshHub();
  };
  try {
    await api.downloadBaseModel(generation, onEvent);
  } catch (error) {
    await refreshHub();
    setMessage($(`hub-error-${generation}`), error);
  }
}

async function cancelDownload() {
  try {
    await api.cancelDownload();
  } catch (error) {
    setMessage($('app-error'), error);
  }
}

/** @param {{checkpoint: string|null, tokenizer: string|null}} remembered the preferences' model files */
export function showModelPaths({ checkpoint, tokenizer }) {
  $('checkpoint-path').value = checkpoint ?? '';
  $('tokenizer-path').value = tokenizer ?? '';
  state.model.checkpoint = checkpoint ?? '';
  state.model.tokenizer = tokenizer ?? '';
}

export function wireModel() {
  wireModelPath('checkpoint', 'Needle checkpoint', ['pkl', 'safetensors']);
  wireModelPath('tokenizer', 'SentencePiece tokenizer', ['model']);
  $('device-select').addEventListener('change', () => {
    state.model.device = $('device-select').value;
    savePreferences();
    tell('inputs', null);
  });
  hear('preferences', savePreferences);
  $('hub-retry').addEventListener('click', refreshHub);
}
