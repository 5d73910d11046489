// @ts-check
// The History step: past trainings, newest first; open one to see its result, resume one cut short.

import * as api from '../ground/api.js';
import { $, basename, formatDate, formatLoss, h, setMessage } from '../ground/dom.js';
import { hear, showEntry, state, tell } from '../ground/state.js';
import { showTab } from '../ground/tabs.js';

/** @typedef {import('../ground/types.js').HistoryEntry} HistoryEntry */
/** @typedef {import('../ground/types.js').Opened} Opened */

/** @param {HistoryEntry[]} entries */
export function renderHistory(entries) {
  const sorted = [...entries].sort((a, b) => b.started_at - a.started_at);
  $('history-empty').hidden = sorted.length > 0;
  $('history-list').replaceChildren(...sorted.map(historyItem));
  updateButtons();
}

/** One training or build at a time: the list waits while either goes. */
function updateButtons() {
  for (const item of document.querySelectorAll('.history-item, .history-resume')) {
    /** @type {HTMLButtonElement} */ (item).disabled = state.running || state.building;
  }
}

/** @param {HistoryEntry} entry */
function historyItem(entry) {
  const button = h('button', { type: 'button', class: 'history-item', 'data-id': entry.id },
    h('span', {}, formatDate(entry.started_at)),
    h('span', { class: 'path' }, basename(entry.request.dataset)),
    h('span', { class: 'status-text', 'data-status': entry.status }, entry.status),
    h('span', {}, entry.final_loss != null ? `loss ${formatLoss(entry.final_loss)}` : '–'),
    h('span', { class: 'published', title: entry.cact?.published?.url ?? '' }, entry.cact?.published ? 'published' : ''),
    h('span', { class: 'threshold' }, entry.threshold != null ? `threshold ${entry.threshold.toFixed(2)}` : ''),
    h('span', { class: 'acceptance', title: acceptanceTitle(entry) }, acceptanceText(entry)));
  if (entry.id === state.viewedId) button.setAttribute('aria-current', 'true');
  button.addEventListener('click', () => openTraining(entry.id));
  if (!entry.resumable) return h('li', {}, button);
  const resume = h('button', { type: 'button', class: 'history-resume', 'data-id': entry.id }, 'Resume');
  resume.addEventListener('click', () => tell('resume', entry.id));
  return h('li', {}, button, resume);
}

/**
 * The last acceptance run's verdict on the model that ships (the last one scored).
 * @param {HistoryEntry} entry
 */
function acceptanceText(entry) {
  const shipped = entry.acceptance?.models.at(-1);
  return shipped ? `${shipped.model} ${shipped.contract ? 'PASS' : 'FAIL'}` : '';
}

/** @param {HistoryEntry} entry */
function acceptanceTitle(entry) {
  const run = entry.acceptance;
  return run ? `${run.name} at threshold ${run.min_confidence.toFixed(2)}: ` +
    run.models.map((m) => `${m.model} ${m.passed}/${m.total}`).join(', ') : '';
}

async function refreshHistory() {
  try {
    renderHistory(await api.history());
    setMessage($('history-error'), null);
  } catch (error) {
    setMessage($('history-error'), error);
  }
}

/**
 * Shows a past training everywhere: its settings, chart, status, result and scores.
 * @param {string} id
 */
async function openTraining(id) {
  try {
    const opened = await api.openTraining(id);
    tell('opened', opened);
    showEntry(opened.entry);
    showTab('evaluate');
    setMessage($('history-error'), null);
  } catch (error) {
    setMessage($('history-error'), error);
  }
}

/**
 * Marks the training opened (here, or by Resume) as the one viewed.
 * @param {Opened} opened
 */
function markViewed({ entry }) {
  state.viewedId = entry.id;
  for (const item of document.querySelectorAll('.history-item')) {
    if (/** @type {HTMLElement} */ (item).dataset.id === entry.id) item.setAttribute('aria-current', 'true');
    else item.removeAttribute('aria-current');
  }
}

export function wireHistory() {
  hear('history', refreshHistory);
  hear('busy', updateButtons);
  hear('opened', markViewed);
}
