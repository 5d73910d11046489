// @ts-check
// The Base model panel: the checkpoint and tokenizer fields, and Needle 2 from the hub (cached, or
// downloaded with a progress bar and Cancel).

import * as api from './api.js';
import { $, basename, formatBytes, setMessage, setStatus } from './dom.js';
import { scheduleDatasetReload } from './dataset.js';
import { pickPath } from './files.js';
import { pathValue, runInputsChanged, saveSettings } from './run.js';

/** @typedef {import('./types.js').BaseModel} BaseModel */
/** @typedef {import('./types.js').BaseModelStatus} BaseModelStatus */
/** @typedef {import('./types.js').DownloadMessage} DownloadMessage */

/** The base model's status, as `base_model` last said. @type {BaseModelStatus|null} */
let hub = null;

/**
 * A model file's field and its Choose… button.
 * @param {'checkpoint'|'tokenizer'} name @param {string} label @param {string} ext
 */
function wireModelPath(name, label, ext) {
  const input = $(`${name}-path`);
  const commit = () => {
    saveSettings();
    runInputsChanged();
    if (hub) renderHub(hub);
    if (name === 'tokenizer') scheduleDatasetReload();
  };
  input.addEventListener('input', runInputsChanged);
  input.addEventListener('change', commit);
  $(`${name}-choose`).addEventListener('click', async () => {
    const path = await pickPath({ name: label, ext, current: input.value.trim(), errorEl: $(`error-${name}`) });
    if (!path) return;
    input.value = path;
    commit();
  });
}

/**
 * The hub row: Needle 2 cached (with its path), downloading (bar, Cancel), or offered with its size.
 * @param {BaseModelStatus} status
 */
function renderHub(status) {
  hub = status;
  const { cached, download } = status;
  const running = download.state === 'running';
  $('hub-download').hidden = Boolean(cached) || running;
  $('hub-use').hidden = !cached || pathValue('checkpoint') === cached.checkpoint;
  $('hub-cancel').hidden = !running;
  $('hub-progress').hidden = !running;
  if (download.state === 'running') {
    renderHubProgress(download.file, download.bytes, download.total, null);
  } else if (cached) {
    setStatus($('hub-status'), 'cached', 'Needle 2 is on this computer');
    $('hub-detail').textContent = cached.checkpoint;
  } else {
    setStatus($('hub-status'), 'idle', `Needle 2 is not on this computer yet (${status.repo})`);
    const resume = status.partial_bytes > 0 ? `; ${formatBytes(status.partial_bytes)} already here, it resumes` : '';
    $('hub-detail').textContent = status.download_bytes != null
      ? `${formatBytes(status.download_bytes)} to download${resume}`
      : status.note ?? '';
    $('hub-download').textContent = status.partial_bytes > 0 ? 'Resume download' : 'Download Needle 2';
  }
  const failed = download.state === 'failed' || download.state === 'cancelled';
  setMessage($('hub-error'), failed && !cached ? download.message : null);
}

/**
 * @param {string} file @param {number} bytes @param {number} total
 * @param {number|null} rate bytes per second
 */
function renderHubProgress(file, bytes, total, rate) {
  setStatus($('hub-status'), 'running', `Downloading ${basename(file) || 'Needle 2'}…`);
  $('hub-progress').max = Math.max(1, total);
  $('hub-progress').value = bytes;
  const speed = rate ? ` · ${formatBytes(rate)}/s` : '';
  $('hub-detail').textContent = `${formatBytes(bytes)} of ${formatBytes(total)}${speed}`;
}

export async function refreshHub() {
  try {
    renderHub(await api.baseModel());
  } catch (error) {
    setMessage($('hub-error'), error);
  }
}

/**
 * Fills the model fields with Needle 2's files, as if chosen by hand.
 * @param {BaseModel} base
 */
function useBaseModel(base) {
  $('checkpoint-path').value = base.checkpoint;
  $('tokenizer-path').value = base.tokenizer;
  saveSettings();
  runInputsChanged();
  scheduleDatasetReload();
}

/** @param {DownloadMessage} message */
function handleDownloadEvent(message) {
  if (message.kind === 'progress') {
    if (message.event === 'started') {
      renderHubProgress(message.file, message.resumed_from, message.total, null);
    } else if (message.event === 'progress') {
      renderHubProgress(message.file, message.bytes, message.total, message.bytes_per_s);
    }
    return;
  }
  if (message.base) useBaseModel(message.base);
  refreshHub();
}

async function downloadBaseModel() {
  setMessage($('hub-error'), null);
  if (hub) renderHub({ ...hub, download: { state: 'running', file: '', bytes: 0, total: 0 } });
  try {
    await api.downloadBaseModel(handleDownloadEvent);
  } catch (error) {
    setMessage($('hub-error'), error);
    refreshHub();
  }
}

async function cancelDownload() {
  try {
    await api.cancelDownload();
  } catch (error) {
    setMessage($('hub-error'), error);
  }
}

/** @param {{checkpoint: string|null, tokenizer: string|null}} remembered the settings' model files */
export function showModelPaths({ checkpoint, tokenizer }) {
  $('checkpoint-path').value = checkpoint ?? '';
  $('tokenizer-path').value = tokenizer ?? '';
}

export function wireModel() {
  wireModelPath('checkpoint', 'Needle checkpoint', 'pkl');
  wireModelPath('tokenizer', 'SentencePiece tokenizer', 'model');
  $('hub-download').addEventListener('click', downloadBaseModel);
  $('hub-cancel').addEventListener('click', cancelDownload);
  $('hub-use').addEventListener('click', () => hub?.cached && useBaseModel(hub.cached));
}
