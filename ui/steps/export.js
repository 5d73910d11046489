// @ts-check
// The Export step: the training's adapter, its build into a .cact at the chosen width, and Publish,
// which pushes the built file to a model repository on the hub (or, cancelled, leaves the hub as it was).
// A Needle 3 model's depth ladder is scored here too, rung by rung, and any rung built as a .cact of its own,
// beside the whole model's (which stays the one Publish uploads).

import * as api from '../ground/api.js';
import { resetCancel, wireCancel } from '../ground/cancel.js';
import { $, basename, errorText, formatBytes, h, setMessage, setStatus } from '../ground/dom.js';
import { pickPath, reveal } from '../ground/files.js';
import { renderKey, wireKey } from '../ground/keys.js';
import { hear, state, tell } from '../ground/state.js';
import { badgeTab } from '../ground/tabs.js';

/** @typedef {import('../ground/types.js').BuildMessage} BuildMessage */
/** @typedef {import('../ground/types.js').BuildWidth} BuildWidth */
/** @typedef {import('../ground/types.js').CactInfo} CactInfo */
/** @typedef {import('../ground/types.js').HistoryEntry} HistoryEntry */
/** @typedef {import('../ground/types.js').Ladder} Ladder */
/** @typedef {import('../ground/types.js').LadderMessage} LadderMessage */
/** @typedef {import('../ground/types.js').PublishMessage} PublishMessage */
/** @typedef {import('../ground/types.js').PublishState} PublishState */
/** @typedef {import('../ground/types.js').Uploaded} Uploaded */

/**
 * Shows the training `entry` (or that there is none to show).
 * @param {HistoryEntry|null} entry
 */
function showResult(entry) {
  $('export').hidden = !entry?.adapter;
  $('export-empty').hidden = Boolean(entry?.adapter);
  if (!entry?.adapter) return;
  $('adapter-path').textContent = entry.adapter;
  $('cact-path').value = entry.suggested_cact;
  $('build-progress').value = 0;
  setBuildStatus('idle', '');
  setMessage($('export-error'), null);
  renderBuilt(entry.cact);
  showLadder(entry.id);
}

/** @param {CactInfo|null} cact */
function renderBuilt(cact) {
  $('build-result').hidden = !cact;
  $('publish-form').hidden = !cact;
  if (!cact) return;
  $('cact-size').textContent = formatBytes(cact.bytes);
  $('cact-tensors').textContent = String(cact.tensors);
  $('cact-scheme').textContent = cact.scheme;
  // This file's own upload: a file built again is unpublished.
  renderPublish(cact.published ? { state: 'published', ...cact.published } : { state: 'idle' });
}

/** @param {'idle'|'building'|'built'|'failed'} status @param {string} text */
const setBuildStatus = (status, text) => setStatus($('build-status'), status, text);

/** @param {boolean} building */
function setBuilding(building) {
  state.building = building;
  $('build-button').disabled = building;
  for (const button of document.querySelectorAll('#ladder-table button')) /** @type {HTMLButtonElement} */ (button).disabled = building;
  tell('busy', null);
}

/**
 * Builds the training's .cact: the whole model, or with `layers` that rung of its ladder, beside it.
 * @param {number|null} layers
 */
async function buildCact(layers) {
  const entry = state.entry;
  if (!entry) return;
  const whole = $('cact-path').value.trim();
  const out = layers === null ? whole : whole.replace(/(\.cact)?$/, `-${layers}-layers.cact`);
  if (!whole) {
    setBuildStatus('failed', 'Choose where to save the .cact file.');
    return;
  }
  const checked = /** @type {HTMLInputElement} */ (document.querySelector('input[name="bits"]:checked'));
  setBuilding(true);
  setBuildStatus('building', 'Starting the build…');
  $('build-progress').value = 0;
  renderBuilt(null);
  try {
    const request = { bits: Number(checked.value), layers, out };
    await api.buildCact(entry.id, request, (message) => handleBuildEvent(entry.id, message));
  } catch (error) {
    setBuilding(false);
    setBuildStatus('failed', errorText(error));
  }
}

/** @param {string} trainingId the training being built @param {BuildMessage} message */
function handleBuildEvent(trainingId, message) {
  if (message.kind === 'built' || message.kind === 'failed') setBuilding(false);
  if (message.kind === 'built') tell('history', null);
  if (state.entry?.id !== trainingId) return; // the panel now shows another training
  switch (message.kind) {
    case 'progress':
      if (message.event === 'stage') {
        $('build-progress').max = message.of;
        $('build-progress').value = message.index;
        setBuildStatus('building', `${message.label} (${message.index}/${message.of})`);
      } else if (message.event === 'merged') {
        const head = message.head ? ', with its trained confidence head' : '';
        setBuildStatus('building', `Merged the adapter into ${message.groups} weight groups${head}`);
      }
      break;
    case 'scoring':
      setBuildStatus('building', 'Answering the held-out examples with the built file…');
      break;
    case 'built':
      state.entry = message.entry;
      $('build-progress').value = $('build-progress').max;
      if (message.cact.layers) {
        setBuildStatus('built', `Built ${basename(message.cact.path)}: the ${message.cact.layers}-layer rung, a file of its own`);
        markBuiltRungs(message.entry);
        break;
      }
      setBuildStatus('built', `Built ${basename(message.cact.path)}`);
      renderBuilt(message.cact);
      tell('rebuilt', state.entry);
      badgeTab('evaluate', message.cact.rows ? '•' : null);
      break;
    case 'failed':
      setBuildStatus('failed', message.message);
      break;
  }
}

/** @param {'idle'|'scoring'|'scored'|'cancelled'|'failed'} status @param {string} text */
const setLadderStatus = (status, text) => setStatus($('ladder-status'), status, text);

/** @param {boolean} scoring */
function setScoring(scoring) {
  $('ladder-button').disabled = scoring;
  $('ladder-cancel').hidden = !scoring;
  resetCancel($('ladder-cancel'));
}

/**
 * The ladder part of the panel for training `trainingId`: Score, or why its model has none.
 * @param {string} trainingId
 */
async function showLadder(trainingId) {
  $('ladder-result').hidden = true;
  $('ladder-progress').value = 0;
  setLadderStatus('idle', '');
  const refusal = await api.ladderRefusal(trainingId).catch(errorText);
  if (state.entry?.id !== trainingId) return;
  $('ladder-refusal').hidden = !refusal;
  $('ladder-refusal').textContent = refusal ?? '';
  $('ladder-actions').hidden = Boolean(refusal);
}

async function scoreLadder() {
  const entry = state.entry;
  if (!entry) return;
  setScoring(true);
  $('ladder-result').hidden = true;
  $('ladder-progress').value = 0;
  setLadderStatus('scoring', 'Starting the sweep…');
  try {
    await api.scoreLadder(entry.id, (message) => handleLadderEvent(entry.id, message));
  } catch (error) {
    setScoring(false);
    setLadderStatus('failed', errorText(error));
  }
}


/** @param {string} trainingId the training whose ladder is scored @param {LadderMessage} message */
function handleLadderEvent(trainingId, message) {
  if (message.kind !== 'progress') setScoring(false);
  if (state.entry?.id !== trainingId) return; // the panel now shows another training
  switch (message.kind) {
    case 'progress':
      if (message.event === 'started') {
        $('ladder-progress').max = Math.max(1, message.rungs.length * message.examples);
      } else if (message.event === 'rung') {
        setLadderStatus('scoring', `Rung ${message.index}/${message.of}: ${message.layers} layers`);
      } else if (message.event === 'answered') {
        $('ladder-progress').value = Number($('ladder-progress').value) + 1;
      }
      break;
    case 'finished':
      $('ladder-progress').value = $('ladder-progress').max;
      setLadderStatus('scored', `${message.ladder.rungs.length} rungs scored on ${message.ladder.examples} held-out examples`);
      renderLadder(message.ladder, message.svg);
      break;
    case 'cancelled':
      $('ladder-progress').value = 0;
      setLadderStatus('cancelled', 'Cancelled: no table, as a partial ladder would rank rungs it never tried.');
      break;
    case 'failed':
      setLadderStatus('failed', message.message);
      break;
  }
}

/** @param {Ladder} ladder @param {string} svg the chart of its exact calls */
function renderLadder(ladder, svg) {
  $('ladder-result').hidden = false;
  $('ladder-chart').innerHTML = svg; // SVG markup from our own Rust: trusted
  $('ladder-table').querySelector('tbody')?.replaceChildren(...ladder.rungs.map((rung) => {
    const build = /** @type {HTMLButtonElement} */ (h('button', { type: 'button' }, 'Build this rung'));
    build.disabled = Boolean(state.building);
    build.addEventListener('click', () => buildCact(rung.layers));
    const calls = `${rung.calls.exact}/${rung.calls.examples}`;
    const built = h('span', { id: `rung-built-${rung.layers}`, class: 'muted small path' });
    return h('tr', {}, h('td', {}, String(rung.layers)), h('td', {}, calls), h('td', {}, formatBytes(rung.cact_bytes)),
      h('td', {}, `${(rung.calls.decode_tokens_per_s ?? 0).toFixed(0)} tok/s`), h('td', {}, build, ' ', built));
  }));
  if (state.entry) markBuiltRungs(state.entry);
}

/**
 * Names, in the ladder's table, the file each rung of `entry` was built into.
 * @param {HistoryEntry} entry
 */
function markBuiltRungs(entry) {
  for (const rung of entry.rungs ?? []) {
    const marker = document.getElementById(`rung-built-${rung.layers}`);
    if (marker) marker.textContent = basename(rung.path);
  }
}

/** @param {'idle'|'publishing'|'published'|'cancelled'|'failed'} status @param {string} text */
const setPublishStatus = (status, text) => setStatus($('publish-status'), status, text);

/** @param {PublishState} publish */
function renderPublish(publish) {
  $('publish-button').disabled = publish.state === 'running';
  $('publish-cancel').hidden = publish.state !== 'running';
  switch (publish.state) {
    case 'idle':
      setPublishStatus('idle', '');
      break;
    case 'running':
      $('publish-progress').max = publish.total || 1;
      $('publish-progress').value = publish.bytes;
      setPublishStatus('publishing', `Uploading ${publish.file}: ${formatBytes(publish.bytes)} of ${formatBytes(publish.total)}`);
      break;
    case 'published':
      $('publish-progress').value = $('publish-progress').max;
      setPublishStatus('published', publish.commit ? `Published at ${publish.url}` : `Already published at ${publish.url}`);
      break;
    case 'cancelled':
      $('publish-progress').value = 0; // nothing of it is on the hub
      setPublishStatus('cancelled', publish.message);
      break;
    case 'failed':
      setPublishStatus('failed', publish.message);
      break;
  }
}

async function cancelPublish() {
  $('publish-cancel').disabled = true;
  try {
    const now = await api.cancelPublish();
    // Unless the outcome came first on the upload's channel.
    if (now.state === 'running' && $('publish-status').dataset.status === 'publishing') {
      setPublishStatus('publishing', 'Cancelling: stopping before anything is committed…');
    }
  } catch (error) {
    setPublishStatus('failed', errorText(error));
  } finally {
    $('publish-cancel').disabled = false;
  }
}

/** @param {string} trainingId the training whose .cact is uploaded @param {PublishMessage} message */
function handlePublishEvent(trainingId, message) {
  if (message.kind === 'finished') {
    const { state: outcome, ...uploaded } = message.state;
    if (outcome === 'published') {
      tell('history', null);
      const cact = state.entry?.id === trainingId ? state.entry.cact : null;
      if (state.entry && cact) state.entry = { ...state.entry, cact: { ...cact, published: /** @type {Uploaded} */ (uploaded) } };
    }
    renderPublish(message.state);
  } else if (message.event === 'uploading' || message.event === 'progress') {
    const bytes = message.event === 'progress' ? message.bytes : 0;
    renderPublish({ state: 'running', file: message.file, bytes, total: message.total });
  }
}

async function publishCact() {
  const entry = state.entry;
  if (!entry?.cact) return;
  $('publish-progress').value = 0;
  renderPublish({ state: 'running', file: basename(entry.cact.path), bytes: 0, total: 0 });
  try {
    await api.publishCact(entry.id, $('publish-repo').value.trim(), (message) => handlePublishEvent(entry.id, message));
  } catch (error) {
    renderPublish({ state: 'failed', message: errorText(error) });
  }
}

/** Fills the Publish form: the repository NEEDLE_HF_REPO names, the token's source, the last upload. */
export async function showPublishSetup() {
  try {
    const setup = await api.publishSetup();
    if (setup.repo && !$('publish-repo').value) $('publish-repo').value = setup.repo;
    renderKey('publish-token', setup.token);
    renderPublish(setup.state);
  } catch (error) {
    setPublishStatus('failed', `Publishing is unavailable: ${errorText(error)}`);
  }
}

/**
 * The widths Build offers, as the app lists them, its default chosen.
 * @param {BuildWidth[]} widths
 */
export function showBuildWidths(widths) {
  $('build-widths').append(...widths.map(({ bits, label, default: chosen }) => {
    const input = h('input', { type: 'radio', name: 'bits', id: `bits-${bits}`, value: String(bits),
      ...(chosen ? { checked: '' } : {}) });
    return h('label', {}, input, ` ${label}`);
  }));
}

export function wireExport() {
  const errorEl = $('export-error');
  $('adapter-reveal').addEventListener('click', () => state.entry?.adapter && reveal(state.entry.adapter, errorEl));
  $('reveal-button').addEventListener('click', () => state.entry?.cact && reveal(state.entry.cact.path, errorEl));
  $('cact-choose').addEventListener('click', async () => {
    const current = $('cact-path').value.trim();
    const path = await pickPath({ name: 'Needle model', ext: 'cact', current, errorEl, save: true });
    if (path) $('cact-path').value = path;
  });
  $('build-button').addEventListener('click', () => buildCact(null));
  $('ladder-button').addEventListener('click', scoreLadder);
  wireCancel($('ladder-cancel'), {
    cancel: api.cancelLadder,
    stopping: 'Cancelling: stopping at the next answer…',
    say: (text) => setLadderStatus('scoring', text),
    failed: (error) => setLadderStatus('failed', errorText(error)),
  });
  $('publish-button').addEventListener('click', publishCact);
  $('publish-cancel').addEventListener('click', cancelPublish);
  wireKey('publish-token', 'hub_token', errorEl);
  hear('shown', showResult);
}
