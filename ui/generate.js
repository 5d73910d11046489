// @ts-check
// Generate more examples (the Data step): count, model, endpoint and the key, then the worker's
// progress, Cancel, and the new rows; the written file becomes the dataset. The app checks the
// request (a dataset chosen, the count) and says what is missing.

import * as api from './api.js';
import { loadDataset } from './dataset.js';
import { $, errorText, formatCount, h, setMessage, setStatus } from './dom.js';
import { pickPath } from './files.js';
import { renderKey, wireKey } from './keys.js';
import { state } from './state.js';

/** @typedef {import('./types.js').GenerateMessage} GenerateMessage */
/** @typedef {import('./types.js').GenerateSetup} GenerateSetup */
/** @typedef {import('./types.js').GenerationState} GenerationState */
/** @typedef {import('./types.js').Written} Written */

/** @param {boolean} running */
function setGenerating(running) {
  $('generate-button').disabled = running;
  $('generate-cancel').disabled = !running;
}

/** @param {Record<string, number>} counts */
const byReason = (counts) =>
  Object.entries(counts).map(([reason, n]) => `${formatCount(n)} ${reason.replaceAll('_', ' ')}`).join(', ');

/** @param {GenerationState} generation */
function renderState(generation) {
  const status = $('generate-status');
  switch (generation.state) {
    case 'idle':
      setStatus(status, 'idle', '');
      break;
    case 'running': {
      $('generate-progress').max = generation.wanted;
      $('generate-progress').value = generation.generated;
      const parts = [`${formatCount(generation.generated)} of ${formatCount(generation.wanted)} new rows`];
      if (generation.failed_requests) parts.push(`${formatCount(generation.failed_requests)} failed request(s)`);
      const rejected = byReason(generation.rejected);
      if (rejected) parts.push(`not kept: ${rejected}`);
      const doing = generation.stopping ? 'Stopping: writing the rows that arrived' : 'Generating';
      setStatus(status, generation.stopping ? 'stopping' : 'running', `${doing} · ${parts.join(' · ')}`);
      break;
    }
    case 'written':
      renderWritten(generation);
      break;
    case 'failed':
      setStatus(status, 'failed', generation.message);
      break;
  }
}

/** @param {Written} written */
function renderWritten(written) {
  $('generate-progress').max = Math.max(1, written.wanted);
  $('generate-progress').value = written.generated;
  const cut = written.cancelled ? ' (cancelled: what arrived is kept)' : '';
  const notes = [byReason(written.rejected) && `not kept: ${byReason(written.rejected)}`,
    byReason(written.advice) && `kept with advice: ${byReason(written.advice)}`].filter(Boolean);
  setStatus($('generate-status'), 'written',
    `${formatCount(written.generated)} new rows${cut}; ${formatCount(written.written)} in ${written.path}` +
      (notes.length ? ` · ${notes.join(' · ')}` : ''));
  $('generate-rows').replaceChildren(...written.rows.map((row) =>
    h('li', {}, String(row.query ?? ''), h('code', {}, JSON.stringify(row.answers ?? [])))));
}

/** @param {GenerateMessage} message */
function handleGenerateEvent(message) {
  switch (message.kind) {
    case 'progress':
      renderState(message.state);
      break;
    case 'request_failed':
      setMessage($('generate-failure'), `A request failed: ${message.message}`);
      break;
    case 'finished':
      setGenerating(false);
      renderState(message.state);
      // The written file is the dataset from now on: its report is read again.
      if (message.state.state === 'written') loadDataset(message.state.path);
      break;
  }
}

async function generate() {
  setMessage($('generate-error'), null);
  setMessage($('generate-failure'), null);
  $('generate-rows').replaceChildren();
  $('generate-progress').value = 0;
  setGenerating(true);
  setStatus($('generate-status'), 'running', 'Asking the endpoint…');
  const request = {
    dataset: state.dataset ?? '',
    output: $('generate-output').value.trim(),
    count: $('generate-count').value,
    model: $('generate-model').value,
    endpoint: $('generate-endpoint').value,
  };
  try {
    await api.generateExamples(request, handleGenerateEvent);
  } catch (error) {
    setGenerating(false);
    setStatus($('generate-status'), 'idle', '');
    setMessage($('generate-error'), error);
  }
}

async function cancel() {
  try {
    const answer = await api.cancelGeneration();
    if (answer === 'stopping') setStatus($('generate-status'), 'stopping', 'Stopping: writing the rows that arrived…');
  } catch (error) {
    setMessage($('generate-error'), error);
  }
}

/** Fills the form with the defaults the app gives, the key's source and the last generation. */
export async function showGenerateSetup() {
  try {
    const setup = await api.generateSetup();
    $('generate-count').value = String(setup.count);
    $('generate-model').value = setup.model;
    $('generate-endpoint').placeholder = setup.endpoint;
    renderKey('generate-key', setup.key);
    renderState(setup.state);
    setGenerating(setup.state.state === 'running');
  } catch (error) {
    setMessage($('generate-error'), `Generation is unavailable: ${errorText(error)}`);
  }
}

export function wireGenerate() {
  const errorEl = $('generate-error');
  $('generate-button').addEventListener('click', generate);
  $('generate-cancel').addEventListener('click', cancel);
  wireKey('generate-key', 'generate_key', errorEl);
  $('generate-output-choose').addEventListener('click', async () => {
    const current = $('generate-output').value.trim() || state.dataset;
    const path = await pickPath({ name: 'JSONL dataset', ext: 'jsonl', current, errorEl, save: true });
    if (path) $('generate-output').value = path;
  });
  setGenerating(false);
}
